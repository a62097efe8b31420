// Package options checks the Options of a component in its New: every
// problem found, each naming the field, in one error, so that a zero count
// or a missing part fails at construction instead of as a silent "no
// consumers" or a nil-pointer panic at the first message.
package options

import (
	"fmt"
	"strings"
)

// Problems collects what is wrong with one component's options.
type Problems struct {
	component string
	list      []string
}

// Check starts the checks of component's options.
func Check(component string) *Problems { return &Problems{component: component} }

// Need records "<field> <what>" unless ok.
func (p *Problems) Need(ok bool, field, what string) {
	if !ok {
		p.list = append(p.list, field+" "+what)
	}
}

// Err is nil when nothing was recorded, else one error naming every
// problem: "worker: Concurrency must be at least 1; Metrics is required".
func (p *Problems) Err() error {
	if len(p.list) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", p.component, strings.Join(p.list, "; "))
}
