package planner

// BenchScenarios returns the scenarios of `kvtier bench planner` and the
// package benchmarks: the production case that hung the Python planner
// (2,000 candidates, one lane short of 7,877 pages) at cp_size 1, 4 and 8, and the same deficit spread over
// every lane at cp_size 4 and 8.
func BenchScenarios() []Scenario {
	return []Scenario{
		{Seed: 1, Candidates: 2000, CPSize: 1, Deficit: 7877},
		{Seed: 1, Candidates: 2000, CPSize: 4, Deficit: 7877},
		{Seed: 1, Candidates: 2000, CPSize: 8, Deficit: 7877},
		{Seed: 1, Candidates: 2000, CPSize: 4, Deficit: 7877, AllLanes: true},
		{Seed: 1, Candidates: 2000, CPSize: 8, Deficit: 7877, AllLanes: true},
	}
}

// Label names a scenario in benchmark output, e.g. "cp4/lane0-7877".
func (s Scenario) Label() string {
	lanes := "lane0"
	if s.AllLanes {
		lanes = "all-lanes"
	}
	return "cp" + itoa(s.CPSize) + "/" + lanes + "-" + itoa(s.Deficit)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
