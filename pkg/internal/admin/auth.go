package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SessionCookie is the name of the page's session cookie.
const SessionCookie = "ie_admin_session"

// principal is who a request acts for.
type principal struct {
	operator string
	// via is api (bearer token) or web (session cookie).
	via string
	// session is the cookie value, for the CSRF token of a web session.
	session string
	client  string
}

// tokenMatches compares a presented token with the configured one in
// constant time. Both are hashed first, so neither the content nor the
// length of the real token leaks through timing.
func (s *Server) tokenMatches(got string) bool {
	a := sha256.Sum256([]byte(got))
	b := sha256.Sum256([]byte(s.opts.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// bearer authenticates a request by its Authorization header. present
// reports whether it carried one at all.
func (s *Server) bearer(r *http.Request) (p principal, present, ok bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return p, false, false
	}
	scheme, token, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || !s.tokenMatches(strings.TrimSpace(token)) {
		return p, true, false
	}
	return principal{operator: s.opts.Operator, via: "api", client: clientOf(r)}, true, true
}

// session authenticates a request by its session cookie.
func (s *Server) session(r *http.Request) (principal, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return principal{}, false
	}
	op, ok := s.verifySession(c.Value, time.Now())
	if !ok {
		return principal{}, false
	}
	return principal{operator: op, via: "web", session: c.Value, client: clientOf(r)}, true
}

// The session cookie is stateless: base64url("v1|operator|expiry|nonce")
// "." base64url(HMAC-SHA256(key, that)), with the key derived from the
// token, so rotating ADMIN_TOKEN ends every session.

func (s *Server) newSession(operator string, now time.Time) string {
	var nonce [12]byte
	_, _ = rand.Read(nonce[:])
	payload := "v1|" + operator + "|" + strconv.FormatInt(now.Add(s.opts.SessionTTL).Unix(), 10) + "|" + hex.EncodeToString(nonce[:])
	return b64(payload) + "." + b64(string(s.mac("session|"+payload)))
}

func (s *Server) verifySession(v string, now time.Time) (string, bool) {
	enc, sig, ok := strings.Cut(v, ".")
	if !ok {
		return "", false
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", false
	}
	mac, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(mac, s.mac("session|"+string(raw))) {
		return "", false
	}
	parts := strings.Split(string(raw), "|")
	if len(parts) != 4 || parts[0] != "v1" {
		return "", false
	}
	exp, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || now.Unix() >= exp {
		return "", false
	}
	return parts[1], true
}

// csrfToken is the value the page's forms must send back: an HMAC of the
// session, so it cannot be made without the key and is bound to the session.
func (s *Server) csrfToken(session string) string {
	return b64(string(s.mac("csrf|" + session)))
}

func (s *Server) csrfValid(p principal, got string) bool {
	if p.via != "web" {
		return true // a bearer token is not sent by browsers on their own
	}
	want := s.csrfToken(p.session)
	return got != "" && hmac.Equal([]byte(got), []byte(want))
}

func (s *Server) mac(msg string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func deriveKey(token string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("idempotent-events admin session key v1"))
	return m.Sum(nil)
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

var errBadOperator = errors.New("operator name: 1 to 64 letters, digits, spaces or . _ @ + -")

// cleanOperator checks an operator name given by a request.
func cleanOperator(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 64 {
		return "", errBadOperator
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune(" ._@+-", r):
		default:
			return "", errBadOperator
		}
	}
	return s, nil
}

func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (s *Server) setSessionCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     SessionCookie,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"),
		SameSite: http.SameSiteStrictMode,
	})
}
