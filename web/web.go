// Package web is hangar's dashboard: a page served at / and its assets,
// sign-in and terminals under /ui/. Its data calls are the REST API
// (/api/...), which accepts the sign-in cookie in place of the bearer header
// (platform/auth.CookieAuthorization); terminals are a WebSocket here, bridged
// to the sandbox service's AttachTerminal.
//
// The assets are plain HTML, CSS and JavaScript (no build step) embedded in
// the binary; xterm.js is vendored from npm (assets/vendor/README.md).
package web

import (
	"embed"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/auth"
)

// Prefix is the path below which Handler serves everything but the page
// itself (Index): mount Handler there.
const Prefix = "/ui/"

//go:embed assets
var assets embed.FS

// Options configures the dashboard.
type Options struct {
	// Token is the API token sign-in checks and the cookie carries.
	Token string
	// Conn reaches the session and sandbox services (a front door), with
	// the token attached to every call. Terminals use it.
	Conn grpc.ClientConnInterface
	// SandboxConn reaches the sandbox service when Conn does not (a
	// deployed session-svc serving the dashboard); nil means Conn.
	SandboxConn grpc.ClientConnInterface
	// Logger receives terminal records; nil discards.
	Logger *slog.Logger
}

// Handler serves the dashboard below Prefix; Index serves its page.
type Handler struct {
	token     string
	sessions  sessionv1.SessionServiceClient
	sandboxes sandboxv1.SandboxServiceClient
	logger    *slog.Logger
	mux       *http.ServeMux
	index     []byte
}

// New returns the dashboard's handler.
func New(opts Options) (*Handler, error) {
	if opts.Token == "" {
		return nil, errors.New("web: Options.Token is required")
	}
	if opts.Conn == nil {
		return nil, errors.New("web: Options.Conn is required")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sandboxConn := opts.SandboxConn
	if sandboxConn == nil {
		sandboxConn = opts.Conn
	}
	index, err := assets.ReadFile("assets/index.html")
	if err != nil {
		return nil, err
	}
	h := &Handler{
		token:     opts.Token,
		sessions:  sessionv1.NewSessionServiceClient(opts.Conn),
		sandboxes: sandboxv1.NewSandboxServiceClient(sandboxConn),
		logger:    logger,
		mux:       http.NewServeMux(),
		index:     index,
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	files := http.StripPrefix(Prefix+"assets/", http.FileServerFS(static))
	h.mux.Handle("GET "+Prefix+"assets/", withHeaders(files))
	h.mux.HandleFunc("POST "+Prefix+"signin", h.signIn)
	h.mux.HandleFunc("POST "+Prefix+"signout", h.signOut)
	h.mux.HandleFunc("GET "+Prefix+"terminal", h.serveTerminal)
	return h, nil
}

// ServeHTTP serves the paths below Prefix.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Index serves the page (GET /). It holds no data: the page asks for the
// token when the API answers 401.
func (h *Handler) Index() http.Handler {
	return withHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(h.index)
	}))
}

// withHeaders adds the dashboard's security and caching headers: a strict
// content security policy (scripts and connections to this origin only;
// xterm.js sets inline styles), no framing, no referrer, and revalidation
// so that a new hangar's assets are picked up.
func withHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		next.ServeHTTP(w, r)
	})
}

// maxSignInBytes caps the sign-in request body.
const maxSignInBytes = 4 << 10

// signIn checks a pasted token and sets the sign-in cookie: HttpOnly (no
// script reads it), SameSite=Strict (no other site's request carries it),
// Secure when the page was served over TLS. It answers 204, or 401 for a
// wrong token.
func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	if !auth.SameOrigin(r) {
		writeError(w, http.StatusForbidden, "PERMISSION_DENIED", "sign-in from another origin")
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxSignInBytes)).Decode(&body); err != nil || body.Token == "" {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "token: want a JSON body {\"token\": \"...\"} with the API token")
		return
	}
	if !auth.Valid(h.token, auth.Scheme+" "+body.Token) {
		writeError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "that is not this hangar's API token")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: auth.CookieName, Value: h.token, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		MaxAge: int((30 * 24 * time.Hour).Seconds()),
	})
	w.WriteHeader(http.StatusNoContent)
}

// signOut clears the cookie.
func (h *Handler) signOut(w http.ResponseWriter, r *http.Request) {
	if !auth.SameOrigin(r) || r.Header.Get(auth.CSRFHeader) == "" {
		writeError(w, http.StatusForbidden, "PERMISSION_DENIED", "sign-out needs the "+auth.CSRFHeader+" header from this origin")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: auth.CookieName, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	w.WriteHeader(http.StatusNoContent)
}

// authorized reports whether r carries the token, in the bearer header or
// the sign-in cookie.
func (h *Handler) authorized(r *http.Request) bool {
	authorization := r.Header.Get("Authorization")
	if authorization == "" {
		authorization = auth.CookieAuthorization(r)
	}
	return auth.Valid(h.token, authorization)
}

// writeError answers in the REST API's error shape.
func writeError(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": reason, "reason": reason, "message": message})
}

// SignInURL is the dashboard at base (a front door's URL) with the token in
// the fragment: opening it signs in with one click. The fragment never
// reaches a server or a Referer header; the page sends the token to sign-in
// once and removes it from the address bar.
func SignInURL(base, token string) string {
	return strings.TrimSuffix(base, "/") + "/#token=" + url.PathEscape(token)
}
