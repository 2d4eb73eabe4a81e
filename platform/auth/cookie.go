package auth

import (
	"net/http"
	"net/url"
	"strings"
)

// CookieName is the dashboard's sign-in cookie: the API token, set HttpOnly
// and SameSite=Strict by the dashboard's sign-in (package web).
const CookieName = "hangar_token"

// CSRFHeader must be sent (with any value) on a state-changing request that
// authenticates with the cookie. A page on another origin cannot send a
// custom header without a CORS preflight, which hangar never grants; with
// SameSite=Strict (the browser does not send the cookie on cross-site
// requests at all) it is the second of two locks.
const CSRFHeader = "X-Hangar-Request"

// CookieAuthorization is the Authorization value ("Bearer <token>") a
// browser request carries in the sign-in cookie, or "" when it has none or
// it may not use it: a request that says where it comes from (Origin,
// Sec-Fetch-Site) must come from this origin, and one that is not GET or
// HEAD must carry CSRFHeader. A WebSocket handshake is a GET; browsers always
// send its Origin, which is checked here.
func CookieAuthorization(r *http.Request) string {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return ""
	}
	if !SameOrigin(r) {
		return ""
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Header.Get(CSRFHeader) == "" {
		return ""
	}
	return Scheme + " " + c.Value
}

// SameOrigin reports whether a browser request comes from a page of the
// origin it is addressed to: its Origin header, when sent, names the
// request's own host, and its Sec-Fetch-Site, when sent, is same-origin or
// none (typed in the address bar).
func SameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}
