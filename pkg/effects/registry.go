package effects

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Registry maps events to their handlers and object transitions to their
// transition handlers. Register everything before the worker starts; a
// Registry is read concurrently afterwards and must not change.
//
// Every handler has a name, which identifies it across builds and deploys
// (a function's identity does not survive either): the worker records the
// set of names it runs with every event it commits, refuses to commit once
// a newer set runs beside it, and a handler added later can be run by name
// over the events committed without it.
type Registry struct {
	routes      []route
	transitions []transitionRoute
	names       map[string]bool
}

type route struct {
	name, source, eventType string
	h                       Handler
}

type transitionRoute struct {
	name, objectType, to string
	h                    TransitionHandler
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{names: map[string]bool{}} }

// handlerName is what a handler's name may be: stable, short, and safe to
// put in a query, a metric label or a command line.
var handlerName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func (r *Registry) claim(call, name string) {
	if !handlerName.MatchString(name) {
		panic(fmt.Sprintf("effects: %s: handler name %q: want 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit", call, name))
	}
	if r.names == nil {
		r.names = map[string]bool{}
	}
	if r.names[name] {
		panic(fmt.Sprintf("effects: %s: a handler named %q is already registered", call, name))
	}
	r.names[name] = true
}

// Handle registers h, named name, for the events of eventType from source.
// source "*" matches every source; eventType "*" matches every type, and a
// trailing ".*" every type with that prefix ("payment_intent.*"). name is
// unique in the Registry and must not change while the handler's effect
// stays the same (see Registry).
func (r *Registry) Handle(name, source, eventType string, h Handler) {
	if source == "" || eventType == "" || h == nil {
		panic(fmt.Sprintf("effects: Handle(%q, %q, %q, %v): source, event type and handler are required", name, source, eventType, h))
	}
	r.claim(fmt.Sprintf("Handle(%q, %q, %q)", name, source, eventType), name)
	r.routes = append(r.routes, route{name: name, source: source, eventType: eventType, h: h})
}

// HandleFunc registers f as a Handler; see Handle.
func (r *Registry) HandleFunc(name, source, eventType string, f func(ctx context.Context, ev Event, tx Tx, out Outbox) error) {
	r.Handle(name, source, eventType, HandlerFunc(f))
}

// OnTransition registers h, named name, for every transition of an
// objectType object (payment_intent, charge) into state to; to "*" matches
// every state. Names are shared with Handle's: one name, one handler.
func (r *Registry) OnTransition(name, objectType, to string, h TransitionHandler) {
	if objectType == "" || to == "" || h == nil {
		panic(fmt.Sprintf("effects: OnTransition(%q, %q, %q, %v): object type, state and handler are required", name, objectType, to, h))
	}
	r.claim(fmt.Sprintf("OnTransition(%q, %q, %q)", name, objectType, to), name)
	r.transitions = append(r.transitions, transitionRoute{name: name, objectType: objectType, to: to, h: h})
}

// OnTransitionFunc registers f as a TransitionHandler; see OnTransition.
func (r *Registry) OnTransitionFunc(name, objectType, to string, f func(ctx context.Context, t Transition, tx Tx, out Outbox) error) {
	r.OnTransition(name, objectType, to, TransitionFunc(f))
}

// HandlerInfo describes one registered handler.
type HandlerInfo struct {
	Name string `json:"name"`
	// Source and EventType are an event handler's routes.
	Source    string `json:"source,omitempty"`
	EventType string `json:"event_type,omitempty"`
	// ObjectType and To are a transition handler's.
	ObjectType string `json:"object_type,omitempty"`
	To         string `json:"to,omitempty"`
}

// Set is a Registry's identity: the handlers it runs, and an ID that
// changes when any of them is added, removed, renamed or routed
// differently, and only then (not with the order of registration, nor with
// a rebuild).
type Set struct {
	// ID is 16 hex digits of a SHA-256 of the handlers.
	ID string `json:"id"`
	// Handlers are sorted by name.
	Handlers []HandlerInfo `json:"handlers"`
}

// Has reports whether the set runs a handler named name.
func (s Set) Has(name string) bool {
	return slices.ContainsFunc(s.Handlers, func(h HandlerInfo) bool { return h.Name == name })
}

// Set returns the Registry's identity.
func (r *Registry) Set() Set {
	hs := make([]HandlerInfo, 0, len(r.routes)+len(r.transitions))
	for _, rt := range r.routes {
		hs = append(hs, HandlerInfo{Name: rt.name, Source: rt.source, EventType: rt.eventType})
	}
	for _, rt := range r.transitions {
		hs = append(hs, HandlerInfo{Name: rt.name, ObjectType: rt.objectType, To: rt.to})
	}
	slices.SortFunc(hs, func(a, b HandlerInfo) int { return strings.Compare(a.Name, b.Name) })
	// JSON: an unambiguous encoding of the sorted list.
	b, err := json.Marshal(hs)
	if err != nil {
		panic(fmt.Sprintf("effects: encode the handler set: %v", err)) // strings only: cannot fail
	}
	sum := sha256.Sum256(b)
	return Set{ID: hex.EncodeToString(sum[:])[:16], Handlers: hs}
}

// Handlers returns the handlers of ev, in registration order.
func (r *Registry) Handlers(ev Event) []Handler {
	var hs []Handler
	for _, rt := range r.routes {
		if (rt.source == "*" || rt.source == ev.Source) && typeMatches(rt.eventType, ev.Type) {
			hs = append(hs, rt.h)
		}
	}
	return hs
}

// Named returns the event handler registered as name, with its routes; ok
// is false when no event handler has that name (a transition handler is
// not one). A backfill runs it alone over the events it missed.
func (r *Registry) Named(name string) (h Handler, info HandlerInfo, ok bool) {
	for _, rt := range r.routes {
		if rt.name == name {
			return rt.h, HandlerInfo{Name: rt.name, Source: rt.source, EventType: rt.eventType}, true
		}
	}
	return nil, HandlerInfo{}, false
}

// Empty reports whether nothing is registered.
func (r *Registry) Empty() bool { return len(r.routes) == 0 && len(r.transitions) == 0 }

// Transition runs the transition handlers of t, in registration order, in
// the transaction tx. A handler that keeps object state calls it for every
// transition it applies.
func (r *Registry) Transition(ctx context.Context, t Transition, tx Tx, out Outbox) error {
	for _, rt := range r.transitions {
		if rt.objectType != t.Object.Type || (rt.to != "*" && rt.to != t.To) {
			continue
		}
		if err := rt.h.HandleTransition(ctx, t, tx, out); err != nil {
			return fmt.Errorf("transition of %s %s from %q to %q: %w", t.Object.Type, t.Object.ID, t.From, t.To, err)
		}
	}
	return nil
}

func typeMatches(pattern, typ string) bool {
	if pattern == "*" || pattern == typ {
		return true
	}
	prefix, ok := strings.CutSuffix(pattern, "*")
	return ok && strings.HasSuffix(prefix, ".") && strings.HasPrefix(typ, prefix)
}

// Apply runs the handlers of evs inside tx: for each handler, in
// registration order, the events of evs routed to it, in order (all at
// once for a BatchHandler). It reports, for each event, whether its effect
// was applied: false when no handler takes it or every one returned Skip.
// Any other error stops it; the caller rolls tx back. It does not recover
// panics.
func (r *Registry) Apply(ctx context.Context, evs []Event, tx Tx, out Outbox) (applied []bool, err error) {
	applied = make([]bool, len(evs))
	for _, rt := range r.routes {
		var mine []int
		for i, ev := range evs {
			if (rt.source == "*" || rt.source == ev.Source) && typeMatches(rt.eventType, ev.Type) {
				mine = append(mine, i)
			}
		}
		if len(mine) == 0 {
			continue
		}
		if bh, ok := rt.h.(BatchHandler); ok && len(mine) > 1 {
			batch := make([]Event, len(mine))
			for j, i := range mine {
				batch[j] = evs[i]
			}
			skip, err := bh.HandleBatch(ctx, batch, tx, out)
			if err != nil {
				return nil, err
			}
			for j, i := range mine {
				if skip == nil || !skip[j] {
					applied[i] = true
				}
			}
			continue
		}
		for _, i := range mine {
			err := rt.h.Handle(ctx, evs[i], tx, out)
			if skipped(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("event %s: %w", evs[i].Key, err)
			}
			applied[i] = true
		}
	}
	return applied, nil
}

func skipped(err error) bool {
	var s *SkipError
	return errors.As(err, &s)
}
