package effects

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Registry maps events to their handlers and object transitions to their
// transition handlers. Register everything before the worker starts; a
// Registry is read concurrently afterwards and must not change.
type Registry struct {
	routes      []route
	transitions []transitionRoute
}

type route struct {
	source, eventType string
	h                 Handler
}

type transitionRoute struct {
	objectType, to string
	h              TransitionHandler
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{} }

// Handle registers h for the events of eventType from source. source "*"
// matches every source; eventType "*" matches every type, and a trailing
// ".*" every type with that prefix ("payment_intent.*").
func (r *Registry) Handle(source, eventType string, h Handler) {
	if source == "" || eventType == "" || h == nil {
		panic(fmt.Sprintf("effects: Handle(%q, %q, %v): source, event type and handler are required", source, eventType, h))
	}
	r.routes = append(r.routes, route{source: source, eventType: eventType, h: h})
}

// HandleFunc registers f as a Handler; see Handle.
func (r *Registry) HandleFunc(source, eventType string, f func(ctx context.Context, ev Event, tx Tx, out Outbox) error) {
	r.Handle(source, eventType, HandlerFunc(f))
}

// OnTransition registers h for every transition of an objectType object
// (payment_intent, charge) into state to; to "*" matches every state.
func (r *Registry) OnTransition(objectType, to string, h TransitionHandler) {
	if objectType == "" || to == "" || h == nil {
		panic(fmt.Sprintf("effects: OnTransition(%q, %q, %v): object type, state and handler are required", objectType, to, h))
	}
	r.transitions = append(r.transitions, transitionRoute{objectType: objectType, to: to, h: h})
}

// OnTransitionFunc registers f as a TransitionHandler; see OnTransition.
func (r *Registry) OnTransitionFunc(objectType, to string, f func(ctx context.Context, t Transition, tx Tx, out Outbox) error) {
	r.OnTransition(objectType, to, TransitionFunc(f))
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
