package servicetest

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric sums the values of the counters and gauges called name whose
// labels include every given name/value pair; -1 if no series matches.
func Metric(g prometheus.Gatherer, name string, labels ...string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		panic(err)
	}
	total, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				matched := false
				for _, lp := range m.GetLabel() {
					matched = matched || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !matched {
					continue series
				}
			}
			found = true
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if !found {
		return -1
	}
	return total
}
