package server

import (
	"context"
	"errors"
	"io/fs"

	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

func fileErr(id, path string, err error) error {
	switch {
	case errors.Is(err, driver.ErrFileNotFound):
		return fault.Wrap(fault.KindNotFound, "FILE_NOT_FOUND", "file "+quote(path)+" not found in sandbox "+quote(id), err)
	case errors.Is(err, driver.ErrOutsideSandbox):
		return &fault.Error{Kind: fault.KindInvalidArgument, Reason: "PATH_OUTSIDE_SANDBOX", Field: "path",
			Message: "path " + quote(path) + " leaves the sandbox", Err: err}
	case errors.Is(err, driver.ErrTooLarge):
		return fault.Wrap(fault.KindFailedPrecondition, "FILE_TOO_LARGE", "file "+quote(path)+" is larger than 4 MB; read it with exec (cat)", err)
	case errors.Is(err, driver.ErrIsDirectory):
		return fault.Wrap(fault.KindFailedPrecondition, "IS_A_DIRECTORY", quote(path)+" is a directory", err)
	case errors.Is(err, driver.ErrNotDirectory):
		return fault.Wrap(fault.KindFailedPrecondition, "NOT_A_DIRECTORY", quote(path)+" is not a directory", err)
	case errors.Is(err, driver.ErrDestroyed):
		return fault.Wrap(fault.KindNotFound, "SANDBOX_NOT_FOUND", "sandbox "+quote(id)+" was destroyed", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return err
}

func quote(s string) string { return `"` + s + `"` }

func fileInfoProto(fi driver.FileInfo) *sandboxv1.FileInfo {
	p := &sandboxv1.FileInfo{Path: fi.Path, Size: fi.Size, Mode: uint32(fi.Mode.Perm()), LinkTarget: fi.LinkTarget}
	switch {
	case fi.Mode.IsRegular():
		p.Type = sandboxv1.FileType_FILE_TYPE_REGULAR
	case fi.Mode.IsDir():
		p.Type = sandboxv1.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode&fs.ModeSymlink != 0:
		p.Type = sandboxv1.FileType_FILE_TYPE_SYMLINK
	default:
		p.Type = sandboxv1.FileType_FILE_TYPE_OTHER
	}
	if !fi.ModTime.IsZero() {
		p.ModifiedAt = timestamppb.New(fi.ModTime)
	}
	return p
}

func needPath(p string) error {
	if p == "" {
		return fault.InvalidArgument("path", "path is required")
	}
	return nil
}

// ReadFile reads a file of at most 4 MiB.
func (s *Server) ReadFile(ctx context.Context, req *sandboxv1.ReadFileRequest) (*sandboxv1.ReadFileResponse, error) {
	if err := needPath(req.GetPath()); err != nil {
		return nil, err
	}
	e, err := s.use(ctx, req.GetSandboxId(), req.GetFencingToken())
	if err != nil {
		return nil, err
	}
	defer trackUse(ctx, e, useReadFile, req.GetPath())()
	data, fi, err := e.sb.ReadFile(ctx, req.GetPath(), MaxReadFile)
	if err != nil {
		return nil, fileErr(e.id, req.GetPath(), err)
	}
	return &sandboxv1.ReadFileResponse{Info: fileInfoProto(fi), Content: data}, nil
}

// WriteFile creates or replaces a file.
func (s *Server) WriteFile(ctx context.Context, req *sandboxv1.WriteFileRequest) (*sandboxv1.WriteFileResponse, error) {
	if err := needPath(req.GetPath()); err != nil {
		return nil, err
	}
	if req.GetMode() > 0o777 {
		return nil, fault.InvalidArgument("mode", "mode %o has bits beyond 0777", req.GetMode())
	}
	e, err := s.use(ctx, req.GetSandboxId(), req.GetFencingToken())
	if err != nil {
		return nil, err
	}
	defer trackUse(ctx, e, useWriteFile, req.GetPath())()
	fi, err := e.sb.WriteFile(ctx, req.GetPath(), req.GetContent(), fs.FileMode(req.GetMode()))
	if err != nil {
		return nil, fileErr(e.id, req.GetPath(), err)
	}
	return &sandboxv1.WriteFileResponse{Info: fileInfoProto(fi)}, nil
}

// StatFile describes a path (a final symlink is not followed).
func (s *Server) StatFile(ctx context.Context, req *sandboxv1.StatFileRequest) (*sandboxv1.StatFileResponse, error) {
	if err := needPath(req.GetPath()); err != nil {
		return nil, err
	}
	e, err := s.use(ctx, req.GetSandboxId(), req.GetFencingToken())
	if err != nil {
		return nil, err
	}
	fi, err := e.sb.Stat(ctx, req.GetPath())
	if err != nil {
		return nil, fileErr(e.id, req.GetPath(), err)
	}
	return &sandboxv1.StatFileResponse{Info: fileInfoProto(fi)}, nil
}

// ListFiles lists a directory (the work tree when path is empty).
func (s *Server) ListFiles(ctx context.Context, req *sandboxv1.ListFilesRequest) (*sandboxv1.ListFilesResponse, error) {
	e, err := s.use(ctx, req.GetSandboxId(), req.GetFencingToken())
	if err != nil {
		return nil, err
	}
	list, err := e.sb.List(ctx, req.GetPath())
	if err != nil {
		return nil, fileErr(e.id, req.GetPath(), err)
	}
	resp := &sandboxv1.ListFilesResponse{}
	for _, fi := range list {
		resp.Files = append(resp.Files, fileInfoProto(fi))
	}
	return resp, nil
}
