package planner

import (
	"testing"

	"github.com/kvtier/kvtier/policy"
)

// BenchmarkPlan times both planners on the seed's scenario (2,000
// candidates, 7,877-page deficit) at cp_size 1, 4 and 8.
func BenchmarkPlan(b *testing.B) {
	for _, sc := range BenchScenarios() {
		in := sc.Build()
		for _, name := range Names() {
			b.Run(name+"/"+sc.Label(), func(b *testing.B) {
				p, _ := ByName(name)
				var plan policy.Plan
				for b.Loop() {
					var err error
					if plan, err = p.Plan(in); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(plan.Victims)), "victims")
			})
		}
	}
}
