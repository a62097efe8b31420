package dlq

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
)

// Filter selects DLQ messages. Every set field must match; an empty Filter
// matches everything (mutations refuse it unless All is set).
type Filter struct {
	// IDs are DLQ ids (x-ie-dlq-id or derived).
	IDs []string `json:"ids,omitempty"`
	// EventID matches the event id exactly.
	EventID string `json:"event_id,omitempty"`
	// EventType matches the event type exactly, or by prefix when it ends
	// in "*" (payment_intent.*).
	EventType string           `json:"event_type,omitempty"`
	Source    string           `json:"source,omitempty"`
	Reason    broker.DLQReason `json:"reason,omitempty"`
	// OlderThan and NewerThan bound how long the message has been in the
	// DLQ. A message whose dead-lettering time is unknown matches neither.
	OlderThan time.Duration `json:"older_than,omitempty"`
	NewerThan time.Duration `json:"newer_than,omitempty"`
	// All must be set to replay or discard with no other criterion.
	All bool `json:"all,omitempty"`
}

// Selective reports whether the filter narrows the selection at all.
func (f Filter) Selective() bool {
	return len(f.IDs) > 0 || f.EventID != "" || f.EventType != "" || f.Source != "" || f.Reason != "" ||
		f.OlderThan > 0 || f.NewerThan > 0
}

// ErrInvalidFilter wraps every error of Filter.Validate.
var ErrInvalidFilter = errors.New("invalid filter")

// Validate reports a filter that cannot be meant.
func (f Filter) Validate() error {
	if f.OlderThan < 0 || f.NewerThan < 0 {
		return fmt.Errorf("%w: ages must not be negative", ErrInvalidFilter)
	}
	if f.OlderThan > 0 && f.NewerThan > 0 && f.NewerThan <= f.OlderThan {
		return fmt.Errorf("%w: newer-than (%s) must be longer than older-than (%s), or nothing matches", ErrInvalidFilter, f.NewerThan, f.OlderThan)
	}
	if f.Reason != "" && !slices.Contains(broker.DLQReasons(), f.Reason) {
		return fmt.Errorf("%w: reason %q is none of %s", ErrInvalidFilter, f.Reason, broker.DLQReasonNames())
	}
	for _, id := range f.IDs {
		if id == "" || len(id) > 128 {
			return fmt.Errorf("%w: DLQ id %q", ErrInvalidFilter, id)
		}
	}
	return nil
}

// Match reports whether m is selected at time now.
func (f Filter) Match(m Message, now time.Time) bool {
	if len(f.IDs) > 0 && !slices.Contains(f.IDs, m.ID) {
		return false
	}
	if f.EventID != "" && m.EventID != f.EventID {
		return false
	}
	if f.EventType != "" {
		if prefix, ok := strings.CutSuffix(f.EventType, "*"); ok {
			if !strings.HasPrefix(m.EventType, prefix) {
				return false
			}
		} else if m.EventType != f.EventType {
			return false
		}
	}
	if f.Source != "" && m.Source != f.Source {
		return false
	}
	if f.Reason != "" && m.Reason != f.Reason {
		return false
	}
	if f.OlderThan > 0 || f.NewerThan > 0 {
		if m.DeadLetteredAt.IsZero() {
			return false
		}
		age := m.Age(now)
		if f.OlderThan > 0 && age < f.OlderThan {
			return false
		}
		if f.NewerThan > 0 && age > f.NewerThan {
			return false
		}
	}
	return true
}

// String describes the filter for logs and the audit detail.
func (f Filter) String() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("ids", strings.Join(f.IDs, ","))
	add("event_id", f.EventID)
	add("type", f.EventType)
	add("source", f.Source)
	add("reason", string(f.Reason))
	if f.OlderThan > 0 {
		add("older_than", f.OlderThan.String())
	}
	if f.NewerThan > 0 {
		add("newer_than", f.NewerThan.String())
	}
	if len(parts) == 0 {
		if f.All {
			return "all"
		}
		return "none"
	}
	return strings.Join(parts, " ")
}
