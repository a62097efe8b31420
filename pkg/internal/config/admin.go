package config

import (
	"strings"
	"time"
)

// Admin configures the worker's admin server: the DLQ API and page. It is
// off unless ADMIN_TOKEN is set.
type Admin struct {
	AdminAddr string `envconfig:"ADMIN_ADDR" default:":9092"`
	// AdminToken is the bearer token of the API and the password of the
	// page; empty turns the admin server off. Mount it from a Secret.
	AdminToken string `envconfig:"ADMIN_TOKEN" sensitive:"true"`
	// AdminOperator is the identity recorded in the audit trail for API
	// requests that name none (X-Operator header).
	AdminOperator string `envconfig:"ADMIN_OPERATOR" default:"admin-api"`
	// AdminReplayRate bounds DLQ replays per second, shared by all requests.
	AdminReplayRate float64 `envconfig:"ADMIN_REPLAY_RATE" default:"20"`
	// AdminScanLimit bounds the DLQ messages one request reads per pass.
	AdminScanLimit int `envconfig:"ADMIN_DLQ_SCAN_LIMIT" default:"1000"`
	// AdminSessionTTL is how long a login to the page lasts.
	AdminSessionTTL time.Duration `envconfig:"ADMIN_SESSION_TTL" default:"8h"`
}

// AdminEnabled reports whether the admin server runs.
func (a *Admin) AdminEnabled() bool { return a.AdminToken != "" }

// minAdminToken is the shortest token accepted: a bearer token that guards
// replays and discards must not be guessable.
const minAdminToken = 16

func (a *Admin) validate(p *problems) {
	validateAddr(p, "ADMIN_ADDR", a.AdminAddr)
	if a.AdminToken != "" && len(a.AdminToken) < minAdminToken {
		p.add("ADMIN_TOKEN", "must be at least %d characters (or empty to turn the admin API off), got %d", minAdminToken, len(a.AdminToken))
	}
	if strings.TrimSpace(a.AdminToken) != a.AdminToken {
		p.add("ADMIN_TOKEN", "must not start or end with whitespace (a trailing newline from a Secret file?)")
	}
	if a.AdminOperator == "" || len(a.AdminOperator) > 64 {
		p.add("ADMIN_OPERATOR", "must be 1 to 64 characters, got %d", len(a.AdminOperator))
	}
	if a.AdminReplayRate <= 0 || a.AdminReplayRate > 10000 {
		p.add("ADMIN_REPLAY_RATE", "must be more than 0 and at most 10000 replays per second, got %g", a.AdminReplayRate)
	}
	checkRange(p, "ADMIN_DLQ_SCAN_LIMIT", int64(a.AdminScanLimit), 1, 100000)
	if a.AdminSessionTTL < time.Minute || a.AdminSessionTTL > 7*24*time.Hour {
		p.add("ADMIN_SESSION_TTL", "must be between 1m and 168h, got %s", a.AdminSessionTTL)
	}
}
