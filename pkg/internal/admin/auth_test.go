package admin_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/admin"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

const token = "unit-test-token-0123456789"

// offline is a server whose DLQ is unreachable: these tests only exercise
// what happens before a handler would touch it.
func offline(t *testing.T) (*admin.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := admin.New(admin.Options{Token: token, DLQ: dlq.New(dlq.Options{}), Audit: dlq.NewAudit(nil),
		Metrics: admin.NewMetrics(reg), SessionTTL: time.Hour})
	require.NoError(t, err)
	return s, reg
}

func serve(s *admin.Server, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	return w
}

func TestNoTokenNoServer(t *testing.T) {
	_, err := admin.New(admin.Options{DLQ: dlq.New(dlq.Options{}), Audit: dlq.NewAudit(nil)})
	assert.Error(t, err)
}

// Unauthenticated requests get 401: JSON on the API, the sign-in form on
// the page. A wrong token or scheme is as good as none.
func TestUnauthenticatedRequestsGet401(t *testing.T) {
	s, reg := offline(t)
	cases := map[string]func(*http.Request){
		"no header":    func(*http.Request) {},
		"wrong token":  func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token+"x") },
		"token prefix": func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token[:10]) },
		"basic scheme": func(r *http.Request) { r.SetBasicAuth("admin", token) },
		"no scheme":    func(r *http.Request) { r.Header.Set("Authorization", token) },
		"forged cookie": func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: admin.SessionCookie, Value: "djF8ZXZlfDk5OTk5OTk5OTl8eA.AAAA"})
		},
		"garbage cookie": func(r *http.Request) { r.AddCookie(&http.Cookie{Name: admin.SessionCookie, Value: "x"}) },
	}
	for name, prepare := range cases {
		t.Run(name, func(t *testing.T) {
			for _, target := range []string{"/api/dlq", "/api/dlq/0123456789abcdef", "/api/audit", "/ui/dlq", "/ui/dlq/0123456789abcdef/replay"} {
				r := httptest.NewRequest(http.MethodGet, target, nil)
				prepare(r)
				w := serve(s, r)
				assert.Equal(t, http.StatusUnauthorized, w.Code, target)
				assert.Contains(t, w.Header().Get("WWW-Authenticate"), "Bearer", target)
				if strings.HasPrefix(target, "/api/") {
					assert.JSONEq(t, `{"error":"unauthorized","message":"send Authorization: Bearer <ADMIN_TOKEN>"}`, w.Body.String())
				} else {
					assert.Contains(t, w.Body.String(), `id="login"`, "the page offers the sign-in form")
				}
			}
			for _, target := range []string{"/api/dlq/replay", "/api/dlq/discard", "/api/dlq/0123456789abcdef/discard", "/ui/dlq/0123456789abcdef/discard"} {
				r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(`{"all":true}`))
				prepare(r)
				assert.Equal(t, http.StatusUnauthorized, serve(s, r).Code, target)
			}
		})
	}
	assert.Positive(t, servicetest.Metric(reg, "idempotent_events_admin_auth_failures_total", "kind", "missing"))
	assert.Positive(t, servicetest.Metric(reg, "idempotent_events_admin_auth_failures_total", "kind", "token"))
}

func signIn(t *testing.T, s *admin.Server, name string) *http.Cookie {
	t.Helper()
	form := url.Values{"operator": {name}, "token": {token}}
	r := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := serve(s, r)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	cookies := w.Result().Cookies()
	require.Len(t, cookies, 1)
	return cookies[0]
}

// The sign-in sets an HttpOnly, SameSite=Strict session cookie; a wrong
// token sets nothing.
func TestSignInSetsAStrictHttpOnlySessionCookie(t *testing.T) {
	s, _ := offline(t)
	c := signIn(t, s, "Ada Lovelace")
	assert.Equal(t, admin.SessionCookie, c.Name)
	assert.True(t, c.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, c.SameSite)
	assert.Equal(t, "/", c.Path)
	assert.NotContains(t, c.Value, token)

	form := url.Values{"operator": {"eve"}, "token": {"guess-guess-guess-guess"}}
	r := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := serve(s, r)
	assert.Equal(t, http.StatusUnauthorized, w.Code)
	assert.Empty(t, w.Result().Cookies())
	assert.Contains(t, w.Body.String(), "Wrong token.")

	form = url.Values{"operator": {"<script>"}, "token": {token}}
	r = httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w = serve(s, r)
	assert.Equal(t, http.StatusBadRequest, w.Code, "names are restricted")
	assert.NotContains(t, w.Body.String(), "<script>")

	// A session made with another token (after a rotation) is not accepted.
	other, err := admin.New(admin.Options{Token: token + "-rotated", DLQ: dlq.New(dlq.Options{}), Audit: dlq.NewAudit(nil)})
	require.NoError(t, err)
	r = httptest.NewRequest(http.MethodGet, "/ui/dlq", nil)
	r.AddCookie(c)
	assert.Equal(t, http.StatusUnauthorized, serve(other, r).Code)
}

// Forms need the session's CSRF token, and cross-site POSTs are refused
// even with it.
func TestFormsNeedTheCSRFTokenAndTheSameOrigin(t *testing.T) {
	s, reg := offline(t)
	c := signIn(t, s, "ada")
	post := func(form url.Values, header http.Header) int {
		r := httptest.NewRequest(http.MethodPost, "/ui/dlq/0123456789abcdef/discard", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range header {
			r.Header[k] = v
		}
		r.AddCookie(c)
		return serve(s, r).Code
	}
	assert.Equal(t, http.StatusForbidden, post(url.Values{}, nil), "no CSRF token")
	assert.Equal(t, http.StatusForbidden, post(url.Values{"csrf": {"bogus"}}, nil), "wrong CSRF token")
	assert.Equal(t, http.StatusForbidden, post(url.Values{"csrf": {"bogus"}}, http.Header{"Sec-Fetch-Site": {"cross-site"}}), "cross-site")
	r := httptest.NewRequest(http.MethodPost, "/ui/logout", nil)
	r.AddCookie(c)
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	assert.Equal(t, http.StatusForbidden, serve(s, r).Code, "even sign-out is same-origin only")
	assert.Positive(t, servicetest.Metric(reg, "idempotent_events_admin_auth_failures_total", "kind", "csrf"))
}

func TestSecurityHeaders(t *testing.T) {
	s, _ := offline(t)
	w := serve(s, httptest.NewRequest(http.MethodGet, "/ui/login", nil))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Contains(t, w.Header().Get("Content-Security-Policy"), "default-src 'none'")
	assert.Equal(t, "DENY", w.Header().Get("X-Frame-Options"))
	assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	css := serve(s, httptest.NewRequest(http.MethodGet, "/ui/style.css", nil))
	assert.Equal(t, http.StatusOK, css.Code)
	assert.Contains(t, css.Header().Get("Content-Type"), "text/css")
}
