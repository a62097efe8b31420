package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
)

// GitHubAPIURL is GitHub.com's REST API; GitHub Enterprise Server's is
// https://<host>/api/v3.
const GitHubAPIURL = "https://api.github.com"

// GitHubMaxWindow is how long GitHub keeps a hook's deliveries.
const GitHubMaxWindow = 72 * time.Hour

// gitHubAPIVersion is the REST API version the requests ask for.
const gitHubAPIVersion = "2022-11-28"

// Delivery is one attempt of a GitHub webhook to deliver an event. Every
// attempt of one event, redeliveries included, has the event's GUID (the
// X-GitHub-Delivery header the receiver keys the event by) and an ID of
// its own.
type Delivery struct {
	ID          int64     `json:"id"`
	GUID        string    `json:"guid"`
	DeliveredAt time.Time `json:"delivered_at"`
	Redelivery  bool      `json:"redelivery"`
	// Status is GitHub's description ("OK", "Invalid HTTP Response: 503");
	// StatusCode the endpoint's answer, 0 when there was none (a timeout,
	// a refused connection).
	Status     string `json:"status"`
	StatusCode int    `json:"status_code"`
	Event      string `json:"event"`
	Action     string `json:"action"`
}

// Succeeded reports whether the endpoint accepted the attempt (2xx): the
// receiver answers 2xx only once the event is on the broker.
func (d Delivery) Succeeded() bool { return d.StatusCode >= 200 && d.StatusCode < 300 }

// DeliveryPage is one page of a hook's deliveries, newest first.
type DeliveryPage struct {
	Deliveries []Delivery
	// Next is the cursor of the next page, "" on the last one.
	Next string
}

// Hook is a GitHub webhook's record of its deliveries; *GitHubHook is the
// REST API's.
type Hook interface {
	// Deliveries lists one page of deliveries, newest first, from cursor
	// ("" for the newest).
	Deliveries(ctx context.Context, cursor string) (DeliveryPage, error)
	// Redeliver asks GitHub to deliver the delivery's event again, under
	// the same GUID; GitHub sends it asynchronously.
	Redeliver(ctx context.Context, deliveryID int64) error
}

// GitHubHookOptions configures a GitHubHook.
type GitHubHookOptions struct {
	// Token is a fine-grained personal access token or a GitHub App
	// installation token with "Webhooks: read and write" on the repository
	// (for a repository hook), or "Webhooks: read and write" on the
	// organization (admin:org_hook for a classic token) for an
	// organization hook.
	Token string
	// URL is the API's address: GitHubAPIURL, GHES's, or a fake's in tests.
	URL string
	// Repo ("owner/name") or Org names the hook's owner: exactly one.
	Repo, Org string
	HookID    int64
	// Rate is the most requests per second. GitHub allows 5,000 requests
	// an hour per token and, as secondary limits, 80 content-creating
	// requests (a redelivery is one) a minute and 500 an hour.
	Rate float64
	// MaxWait bounds how long one request keeps being retried: waiting out
	// a rate limit, or retrying 5xx answers and network errors, with
	// backoff. A rate limit that resets later than that fails the run.
	MaxWait time.Duration
	// FirstBackoff is the first wait after a 5xx, a network error or a 429
	// without a reset time (default 1 s); it doubles up to 30 s.
	FirstBackoff time.Duration
	HTTPClient   *http.Client
}

func (o *GitHubHookOptions) validate() error {
	p := options.Check("github hook")
	p.Need(o.Token != "", "Token", "is required")
	p.Need((o.Repo == "") != (o.Org == ""), "Repo/Org", "name exactly one of a repository (owner/name) and an organization")
	if o.Repo != "" {
		owner, name, ok := strings.Cut(o.Repo, "/")
		p.Need(ok && owner != "" && name != "" && !strings.Contains(name, "/"), "Repo", "must be owner/name")
	}
	p.Need(!strings.Contains(o.Org, "/"), "Org", "must be an organization's login")
	p.Need(o.HookID > 0, "HookID", "must be a hook's id (Settings > Webhooks, the number in the hook's address)")
	if u, err := url.Parse(o.URL); o.URL != "" && (err != nil || u.Scheme == "" || u.Host == "") {
		p.Need(false, "URL", "must be an absolute http(s) URL")
	}
	return p.Err()
}

// GitHubHook reads and redelivers one webhook's deliveries through
// GitHub's REST API, with net/http: google/go-github is not served to this
// project, and the three calls used here are small.
type GitHubHook struct {
	client  *http.Client
	base    string // the API's URL with the hook's path, no trailing slash
	hook    string // the hook's path, for errors
	token   string
	limit   *rate.Limiter
	maxWait time.Duration
	first   time.Duration
	now     func() time.Time
	// Calls counts the requests made, refused ones included.
	Calls int
	// Throttled counts the rate-limit answers (403 or 429) waited out.
	Throttled int
}

// NewGitHubHook returns a GitHubHook for the repository or organization
// hook o names.
func NewGitHubHook(o GitHubHookOptions) (*GitHubHook, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.URL == "" {
		o.URL = GitHubAPIURL
	}
	if o.Rate <= 0 {
		o.Rate = 1
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 10 * time.Minute
	}
	if o.FirstBackoff <= 0 {
		o.FirstBackoff = time.Second
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	var hook string
	if o.Repo != "" {
		owner, name, _ := strings.Cut(o.Repo, "/")
		hook = "/repos/" + url.PathEscape(owner) + "/" + url.PathEscape(name)
	} else {
		hook = "/orgs/" + url.PathEscape(o.Org)
	}
	hook += "/hooks/" + strconv.FormatInt(o.HookID, 10)
	return &GitHubHook{
		client:  o.HTTPClient,
		base:    strings.TrimSuffix(o.URL, "/") + hook,
		hook:    hook,
		token:   o.Token,
		limit:   rate.NewLimiter(rate.Limit(o.Rate), 1),
		maxWait: o.MaxWait,
		first:   o.FirstBackoff,
		now:     time.Now,
	}, nil
}

// GitHubError is an answer of GitHub's API that is not retried.
type GitHubError struct {
	Method, Path string
	StatusCode   int
	// Message is GitHub's "message", or the start of the body.
	Message string
}

func (e *GitHubError) Error() string {
	return fmt.Sprintf("github: %s %s: %d %s: %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// perDelivery reports whether err concerns one delivery only (it is gone,
// or GitHub refuses to redeliver it), so that the run goes on with the
// others. Anything else (a refused token, a missing permission, a rate
// limit or an outage that outlasted MaxWait) would refuse every other
// request the same way.
func perDelivery(err error) bool {
	var ge *GitHubError
	if !errors.As(err, &ge) {
		return false
	}
	switch ge.StatusCode {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusGone, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// Deliveries implements Hook: GET .../hooks/{id}/deliveries, 100 a page.
func (h *GitHubHook) Deliveries(ctx context.Context, cursor string) (DeliveryPage, error) {
	q := url.Values{"per_page": {"100"}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	body, header, err := h.do(ctx, http.MethodGet, "/deliveries", q)
	if err != nil {
		return DeliveryPage{}, err
	}
	var page DeliveryPage
	if err := json.Unmarshal(body, &page.Deliveries); err != nil {
		return DeliveryPage{}, fmt.Errorf("github: list deliveries of %s: %w", h.hook, err)
	}
	if page.Next, err = nextCursor(header); err != nil {
		return DeliveryPage{}, fmt.Errorf("github: list deliveries of %s: %w", h.hook, err)
	}
	return page, nil
}

// Redeliver implements Hook: POST .../deliveries/{id}/attempts, which
// GitHub answers 202 Accepted.
func (h *GitHubHook) Redeliver(ctx context.Context, deliveryID int64) error {
	_, _, err := h.do(ctx, http.MethodPost, "/deliveries/"+strconv.FormatInt(deliveryID, 10)+"/attempts", nil)
	return err
}

// nextCursor reads the cursor of the Link header's rel="next" page. The
// request for it is built against the configured API, not the link's
// host, so that the token goes nowhere else.
func nextCursor(h http.Header) (string, error) {
	for _, v := range h.Values("Link") {
		for _, link := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(link, ";")
			if !ok || !isNext(params) {
				continue
			}
			target = strings.TrimSpace(target)
			u, err := url.Parse(strings.TrimSuffix(strings.TrimPrefix(target, "<"), ">"))
			if err != nil {
				return "", fmt.Errorf("link rel=next %s: %w", target, err)
			}
			cursor := u.Query().Get("cursor")
			if cursor == "" {
				return "", fmt.Errorf("link rel=next %s has no cursor", target)
			}
			return cursor, nil
		}
	}
	return "", nil
}

func isNext(params string) bool {
	for _, p := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(k, "rel") && slices.Contains(strings.Fields(strings.Trim(v, `"`)), "next") {
			return true
		}
	}
	return false
}

// do sends one request, waiting out rate limits and retrying 5xx answers
// and network errors with backoff, within maxWait; it returns a 2xx
// answer's body and headers, or the error.
func (h *GitHubHook) do(ctx context.Context, method, path string, q url.Values) ([]byte, http.Header, error) {
	target := h.base + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	deadline := h.now().Add(h.maxWait)
	delay := h.first
	for {
		if err := h.limit.Wait(ctx); err != nil {
			return nil, nil, err
		}
		req, err := http.NewRequestWithContext(ctx, method, target, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("github: %s %s: %w", method, h.hook+path, err)
		}
		req.Header.Set("Accept", "application/vnd.github+json")
		req.Header.Set("Authorization", "Bearer "+h.token)
		req.Header.Set("X-GitHub-Api-Version", gitHubAPIVersion)
		req.Header.Set("User-Agent", "idempotent-events-reconcile")
		h.Calls++
		resp, err := h.client.Do(req)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(io.LimitReader(resp.Body, 32<<20))
			resp.Body.Close()
		}
		var wait time.Duration
		var cause error
		switch {
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		case err != nil:
			wait, cause = backoff.Jitter(delay), err
			delay = min(2*delay, 30*time.Second)
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			return body, resp.Header, nil
		default:
			apiErr := &GitHubError{Method: method, Path: h.hook + path, StatusCode: resp.StatusCode, Message: message(body)}
			limited, reset := h.rateLimited(resp, body)
			switch {
			case limited && reset > 0:
				h.Throttled++
				wait, cause = reset, apiErr
			case limited || resp.StatusCode >= 500:
				if limited {
					h.Throttled++
				}
				wait, cause = backoff.Jitter(delay), apiErr
				delay = min(2*delay, 30*time.Second)
			default:
				return nil, nil, apiErr
			}
		}
		if h.now().Add(wait).After(deadline) {
			return nil, nil, fmt.Errorf("github: %s %s: giving up, the next try would be in %s, past the %s allowed: %w",
				method, h.hook+path, wait.Round(time.Second), h.maxWait, cause)
		}
		if !backoff.Sleep(ctx, wait) {
			return nil, nil, ctx.Err()
		}
	}
}

// rateLimited reads a rate-limit answer as GitHub documents it: a 403 or
// 429 with retry-after (wait that long), or with x-ratelimit-remaining: 0
// (wait until x-ratelimit-reset), or a 403/429 whose message names a
// secondary rate limit without either header (wait at least a minute). A
// 403 without these is a missing permission.
func (h *GitHubHook) rateLimited(resp *http.Response, body []byte) (bool, time.Duration) {
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusTooManyRequests {
		return false, 0
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if secs, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && secs >= 0 {
			return true, max(time.Duration(secs)*time.Second, time.Millisecond)
		}
	}
	if resp.Header.Get("X-RateLimit-Remaining") == "0" {
		if reset, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64); err == nil {
			// The reset is in whole seconds of GitHub's clock: a second
			// more covers the rounding and a small skew.
			return true, max(time.Unix(reset, 0).Sub(h.now()), 0) + time.Second
		}
		return true, 0
	}
	if strings.Contains(strings.ToLower(message(body)), "rate limit") {
		return true, time.Minute
	}
	return resp.StatusCode == http.StatusTooManyRequests, 0
}

// message is GitHub's error message, or the start of a body without one.
func message(body []byte) string {
	var e struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err == nil && e.Message != "" {
		return e.Message
	}
	body = bytes.TrimSpace(body)
	if len(body) > 200 {
		body = body[:200]
	}
	return string(body)
}
