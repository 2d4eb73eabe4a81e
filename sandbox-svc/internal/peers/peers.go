// Package peers lets several sandbox-svc replicas serve as one: a sandbox
// lives in the replica that created it (its processes, its directory under
// that replica's HANGAR_SANDBOX_ROOT), and any replica answers a call on it
// by forwarding the call to that replica. Redis says where each sandbox is
// (`<prefix>at:<sandbox id>` = the owner's peer address) and which replicas
// live (`<prefix>peer:<address>`, a heartbeat). Destroy notices of every
// live replica reach a subscriber of any one (WatchDestroys relays the
// peers' streams; AckDestroy goes back to the replica that sent the
// notice). A forwarded call carries x-hangar-forwarded and is always served
// where it lands, so a stale location never loops.
package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// forwardedKey marks a call one replica forwarded to another.
const forwardedKey = "x-hangar-forwarded"

// heartbeatTTL is how long a replica counts as live after its last beat.
const heartbeatTTL = 15 * time.Second

// locationTTL bounds a sandbox's location record (a sandbox lives at most
// its lease's MaxTTL without renewal; a crashed replica's records lapse).
const locationTTL = 24 * time.Hour

// Options configure a forwarding server.
type Options struct {
	// Self is the address other replicas reach this one at.
	Self   string
	Token  string
	Redis  *redis.Client
	Prefix string // "hangar:sandbox:"
	Logger *slog.Logger
	// Timeout is the default deadline of forwarded unary calls.
	Timeout time.Duration
}

// Server wraps a replica's own server.
type Server struct {
	sandboxv1.SandboxServiceServer
	o Options

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// relayed maps a notice a peer sent through this replica to that peer.
	relayed map[string]string
}

// New wraps inner. Run keeps the heartbeat.
func New(inner sandboxv1.SandboxServiceServer, o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{SandboxServiceServer: inner, o: o, conns: map[string]*grpc.ClientConn{}, relayed: map[string]string{}}
}

// Run beats this replica's heartbeat and records where the sandboxes it
// serves already (leftovers revived at start) live, until ctx ends; then
// it closes the peer connections.
func (s *Server) Run(ctx context.Context) {
	defer logging.Recover(ctx, s.o.Logger, "sandbox replica heartbeat")
	if list, err := s.SandboxServiceServer.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{}); err == nil {
		for _, sb := range list.GetSandboxes() {
			s.locate(ctx, sb.GetId())
		}
	}
	t := time.NewTicker(heartbeatTTL / 3)
	defer t.Stop()
	for {
		if err := s.o.Redis.Set(ctx, s.o.Prefix+"peer:"+s.o.Self, time.Now().UTC().Format(time.RFC3339), heartbeatTTL).Err(); err != nil && ctx.Err() == nil {
			s.o.Logger.WarnContext(ctx, "sandbox replica heartbeat not renewed", "error", err)
		}
		select {
		case <-ctx.Done():
			_ = s.o.Redis.Del(context.WithoutCancel(ctx), s.o.Prefix+"peer:"+s.o.Self).Err()
			s.mu.Lock()
			for _, c := range s.conns {
				_ = c.Close()
			}
			s.conns = map[string]*grpc.ClientConn{}
			s.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

func (s *Server) locate(ctx context.Context, id string) {
	if err := s.o.Redis.Set(ctx, s.o.Prefix+"at:"+id, s.o.Self, locationTTL).Err(); err != nil {
		s.o.Logger.WarnContext(ctx, "sandbox location not recorded", "sandbox", id, "error", err)
	}
}

func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

// outgoing is ctx for a forwarded call: the caller's hangar metadata (a
// service's own call stays one), marked forwarded; the token is the
// connection's.
func outgoing(ctx context.Context) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for k, v := range in {
		if strings.HasPrefix(k, "x-hangar-") || k == "traceparent" {
			out[k] = v
		}
	}
	out.Set(forwardedKey, "1")
	return metadata.NewOutgoingContext(ctx, out)
}

func (s *Server) client(addr string) (sandboxv1.SandboxServiceClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.conns[addr]
	if c == nil {
		var err error
		if c, err = rpc.Dial(addr, rpc.ClientOptions{Token: s.o.Token, DefaultTimeout: s.o.Timeout}); err != nil {
			return nil, fmt.Errorf("sandbox replica %s: %w", addr, err)
		}
		s.conns[addr] = c
	}
	return sandboxv1.NewSandboxServiceClient(c), nil
}

// peerOf is the client of the replica serving sandbox id, or nil when it
// is this one (or unknown: this one answers, NotFound if it lacks it).
func (s *Server) peerOf(ctx context.Context, id string) (sandboxv1.SandboxServiceClient, error) {
	if id == "" || forwarded(ctx) {
		return nil, nil
	}
	addr, err := s.o.Redis.Get(ctx, s.o.Prefix+"at:"+id).Result()
	if errors.Is(err, redis.Nil) || (err == nil && addr == s.o.Self) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("where sandbox %s is: %w", id, err)
	}
	return s.client(addr)
}

// livePeers are the other replicas' addresses.
func (s *Server) livePeers(ctx context.Context) []string {
	var out []string
	iter := s.o.Redis.Scan(ctx, 0, s.o.Prefix+"peer:*", 100).Iterator()
	for iter.Next(ctx) {
		if addr := strings.TrimPrefix(iter.Val(), s.o.Prefix+"peer:"); addr != s.o.Self {
			out = append(out, addr)
		}
	}
	return out
}

// route runs local on this replica or remote on the sandbox's owner.
func route[Req any, Resp any](s *Server, ctx context.Context, id string, req Req,
	local func(context.Context, Req) (Resp, error),
	remote func(sandboxv1.SandboxServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	p, err := s.peerOf(ctx, id)
	if err != nil {
		var zero Resp
		return zero, err
	}
	if p == nil {
		return local(ctx, req)
	}
	return remote(p, outgoing(ctx), req)
}

func (s *Server) AcquireSandbox(ctx context.Context, req *sandboxv1.AcquireSandboxRequest) (*sandboxv1.AcquireSandboxResponse, error) {
	// A copy is made where its source is.
	p, err := s.peerOf(ctx, req.GetCopyOf())
	if err != nil {
		return nil, err
	}
	if p != nil {
		return p.AcquireSandbox(outgoing(ctx), req)
	}
	resp, err := s.SandboxServiceServer.AcquireSandbox(ctx, req)
	if err == nil {
		s.locate(ctx, resp.GetSandbox().GetId())
	}
	return resp, err
}

func (s *Server) RenewLease(ctx context.Context, req *sandboxv1.RenewLeaseRequest) (*sandboxv1.RenewLeaseResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.RenewLease, sandboxv1.SandboxServiceClient.RenewLease)
}

func (s *Server) ReleaseSandbox(ctx context.Context, req *sandboxv1.ReleaseSandboxRequest) (*sandboxv1.ReleaseSandboxResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.ReleaseSandbox, sandboxv1.SandboxServiceClient.ReleaseSandbox)
}

func (s *Server) KillProcesses(ctx context.Context, req *sandboxv1.KillProcessesRequest) (*sandboxv1.KillProcessesResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.KillProcesses, sandboxv1.SandboxServiceClient.KillProcesses)
}

func (s *Server) GetSandbox(ctx context.Context, req *sandboxv1.GetSandboxRequest) (*sandboxv1.GetSandboxResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.GetSandbox, sandboxv1.SandboxServiceClient.GetSandbox)
}

func (s *Server) ReadFile(ctx context.Context, req *sandboxv1.ReadFileRequest) (*sandboxv1.ReadFileResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.ReadFile, sandboxv1.SandboxServiceClient.ReadFile)
}

func (s *Server) WriteFile(ctx context.Context, req *sandboxv1.WriteFileRequest) (*sandboxv1.WriteFileResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.WriteFile, sandboxv1.SandboxServiceClient.WriteFile)
}

func (s *Server) StatFile(ctx context.Context, req *sandboxv1.StatFileRequest) (*sandboxv1.StatFileResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.StatFile, sandboxv1.SandboxServiceClient.StatFile)
}

func (s *Server) ListFiles(ctx context.Context, req *sandboxv1.ListFilesRequest) (*sandboxv1.ListFilesResponse, error) {
	return route(s, ctx, req.GetSandboxId(), req, s.SandboxServiceServer.ListFiles, sandboxv1.SandboxServiceClient.ListFiles)
}

// ListSandboxes lists every live replica's sandboxes.
func (s *Server) ListSandboxes(ctx context.Context, req *sandboxv1.ListSandboxesRequest) (*sandboxv1.ListSandboxesResponse, error) {
	resp, err := s.SandboxServiceServer.ListSandboxes(ctx, req)
	if err != nil || forwarded(ctx) {
		return resp, err
	}
	for _, addr := range s.livePeers(ctx) {
		c, err := s.client(addr)
		if err != nil {
			continue
		}
		more, err := c.ListSandboxes(outgoing(ctx), req)
		if err != nil {
			s.o.Logger.WarnContext(ctx, "sandbox replica not listed", "peer", addr, "error", err)
			continue
		}
		resp.Sandboxes = append(resp.Sandboxes, more.GetSandboxes()...)
	}
	return resp, nil
}

// firstReplayed hands a stream's first message, already read, to the
// local handler.
type firstReplayed[Req any, Resp any] struct {
	grpc.BidiStreamingServer[Req, Resp]
	first *Req
}

func (f *firstReplayed[Req, Resp]) Recv() (*Req, error) {
	if m := f.first; m != nil {
		f.first = nil
		return m, nil
	}
	return f.BidiStreamingServer.Recv()
}

// proxy pumps a bidirectional stream between a caller and a peer.
func proxy[Req any, Resp any](in grpc.BidiStreamingServer[Req, Resp], out grpc.BidiStreamingClient[Req, Resp], first *Req) error {
	if err := out.Send(first); err != nil {
		return err
	}
	go func() {
		for {
			m, err := in.Recv()
			if err != nil {
				_ = out.CloseSend()
				return
			}
			if out.Send(m) != nil {
				return
			}
		}
	}()
	for {
		m, err := out.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := in.Send(m); err != nil {
			return err
		}
	}
}

func (s *Server) Exec(stream grpc.BidiStreamingServer[sandboxv1.ExecRequest, sandboxv1.ExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	p, err := s.peerOf(ctx, first.GetStart().GetSandboxId())
	if err != nil {
		return err
	}
	if p == nil {
		return s.SandboxServiceServer.Exec(&firstReplayed[sandboxv1.ExecRequest, sandboxv1.ExecResponse]{stream, first})
	}
	out, err := p.Exec(outgoing(ctx))
	if err != nil {
		return err
	}
	return proxy(stream, out, first)
}

func (s *Server) AttachTerminal(stream grpc.BidiStreamingServer[sandboxv1.AttachTerminalRequest, sandboxv1.AttachTerminalResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	p, err := s.peerOf(ctx, first.GetOpen().GetSandboxId())
	if err != nil {
		return err
	}
	if p == nil {
		return s.SandboxServiceServer.AttachTerminal(&firstReplayed[sandboxv1.AttachTerminalRequest, sandboxv1.AttachTerminalResponse]{stream, first})
	}
	out, err := p.AttachTerminal(outgoing(ctx))
	if err != nil {
		return err
	}
	return proxy(stream, out, first)
}

// lockedSend serializes Send: this replica's notices and the relayed
// peers' go out on one stream.
type lockedSend struct {
	grpc.ServerStreamingServer[sandboxv1.WatchDestroysResponse]
	mu *sync.Mutex
}

func (l lockedSend) Send(m *sandboxv1.WatchDestroysResponse) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ServerStreamingServer.Send(m)
}

// WatchDestroys sends this replica's notices and relays every live peer's.
func (s *Server) WatchDestroys(req *sandboxv1.WatchDestroysRequest, stream grpc.ServerStreamingServer[sandboxv1.WatchDestroysResponse]) error {
	if forwarded(stream.Context()) {
		return s.SandboxServiceServer.WatchDestroys(req, stream)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	out := lockedSend{stream, &sync.Mutex{}}
	go s.relayPeers(ctx, req, out)
	return s.SandboxServiceServer.WatchDestroys(req, out)
}

// relayPeers keeps one relay per live peer until ctx ends.
func (s *Server) relayPeers(ctx context.Context, req *sandboxv1.WatchDestroysRequest, out lockedSend) {
	defer logging.Recover(ctx, s.o.Logger, "destroy notice relay")
	var mu sync.Mutex
	relaying := map[string]bool{}
	t := time.NewTicker(heartbeatTTL / 3)
	defer t.Stop()
	for {
		for _, addr := range s.livePeers(ctx) {
			mu.Lock()
			busy := relaying[addr]
			relaying[addr] = true
			mu.Unlock()
			if busy {
				continue
			}
			go func() {
				defer func() { mu.Lock(); delete(relaying, addr); mu.Unlock() }()
				s.relay(ctx, addr, req, out)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) relay(ctx context.Context, addr string, req *sandboxv1.WatchDestroysRequest, out lockedSend) {
	c, err := s.client(addr)
	if err != nil {
		return
	}
	in, err := c.WatchDestroys(outgoing(ctx), req)
	if err != nil {
		return
	}
	for {
		m, err := in.Recv()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.relayed[m.GetNotice().GetNoticeId()] = addr
		s.mu.Unlock()
		if out.Send(m) != nil {
			return
		}
	}
}

// AckDestroy acks where the notice came from.
func (s *Server) AckDestroy(ctx context.Context, req *sandboxv1.AckDestroyRequest) (*sandboxv1.AckDestroyResponse, error) {
	s.mu.Lock()
	addr, ok := s.relayed[req.GetNoticeId()]
	delete(s.relayed, req.GetNoticeId())
	s.mu.Unlock()
	if !ok || forwarded(ctx) {
		return s.SandboxServiceServer.AckDestroy(ctx, req)
	}
	c, err := s.client(addr)
	if err != nil {
		return nil, err
	}
	return c.AckDestroy(outgoing(ctx), req)
}
