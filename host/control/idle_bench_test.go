package control

import "testing"

// BenchmarkIdleTick times the tick protocol alone on a Machine with nothing
// in flight: take the contribution, reduce it (one rank), tick, take the
// output. It is the floor under every tick the host/decisions replay pays
// (docs/perf.md, host).
func BenchmarkIdleTick(b *testing.B) {
	o := DefaultOptions()
	o.DigestEvery = 0
	m, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		f, err := Reduce(m.Contribution())
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Tick(f); err != nil {
			b.Fatal(err)
		}
		_ = m.Output()
		m.Advance()
	}
}
