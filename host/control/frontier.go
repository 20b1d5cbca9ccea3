package control

import (
	"errors"
	"fmt"
	"strings"
)

// Pipeline is one pipeline of operations whose completions reach the
// replicated state through the frontier. The ops of a pipeline are numbered
// 1, 2, ... in the replicated order they were issued in; a rank's progress
// on a pipeline is the length of the prefix of them it finished.
type Pipeline uint8

// The pipelines. A spill op belongs to two: gathered, then durable.
const (
	// PipelineBackup: L1→L2 copies of write-through and write-back.
	PipelineBackup Pipeline = iota
	// PipelineLoadBack: L2→L1 copies that bring L2 hits to L1.
	PipelineLoadBack
	// PipelineGather: spills whose pages were gathered off the slab.
	PipelineGather
	// PipelineDurable: spills that are durable in the Store.
	PipelineDurable
	// PipelineLookup: longest-durable-prefix lookups for reloads.
	PipelineLookup
	// PipelineReload: L3→L2 gets of reloads.
	PipelineReload
	// NumPipelines is the number of pipelines.
	NumPipelines
)

var pipelineNames = [NumPipelines]string{"backup", "loadback", "gather", "durable", "lookup", "reload"}

// String returns the pipeline's name.
func (l Pipeline) String() string {
	if l < NumPipelines {
		return pipelineNames[l]
	}
	return fmt.Sprintf("pipeline(%d)", uint8(l))
}

// PipelineProgress is one rank's progress on one pipeline, or, in a Frontier, the
// group's.
type PipelineProgress struct {
	// Base is the number of the pipeline's ops already applied (replicated:
	// equal on every rank).
	Base uint64
	// Done is the number of the pipeline's ops finished, counted from the
	// first (Done >= Base).
	Done uint64
	// OK[i] is op Base+1+i's outcome; len(OK) = Done-Base.
	OK []bool
	// Values[i] is op Base+1+i's value on the lookup pipeline (the
	// longest durable prefix in pages); empty on other pipelines.
	Values []int
}

// Contribution is one rank's local facts offered at a tick: its progress
// on every pipeline and which tiers it can reach. A group reduces the
// contributions of its ranks to a Frontier (Reduce); a later
// host/consensus package takes these types over.
type Contribution struct {
	// Tick is the replicated tick the contribution is for.
	Tick uint64
	// Pipelines is the progress per pipeline.
	Pipelines [NumPipelines]PipelineProgress
	// TierUp has bit t-1 set when tier t is up on this rank.
	TierUp uint8
}

// Frontier is what every rank applies at a tick: per pipeline the MIN of the
// ranks' Done, the AND of their OK bits and the MIN of their values over
// that prefix, and the AND of their tier bits.
type Frontier Contribution

// ErrFrontier marks contributions that cannot be reduced or a frontier the
// Machine cannot apply: a tick or a base that differs, a shape that does
// not match.
var ErrFrontier = errors.New("malformed frontier")

// Reduce combines the contributions of every rank of a group into the
// frontier: element-wise MIN of Done and values, AND of ok bits and tier
// bits. Every contribution must be for the same tick and the same bases.
func Reduce(cs ...Contribution) (Frontier, error) {
	if len(cs) == 0 {
		return Frontier{}, fmt.Errorf("reduce: no contributions: %w", ErrFrontier)
	}
	if len(cs) == 1 {
		// One rank: the frontier is its contribution (sharing its ok bits
		// and values, which nobody writes after they are built).
		c := &cs[0]
		if err := c.check(); err != nil {
			return Frontier{}, fmt.Errorf("reduce: rank 0: %w", err)
		}
		return Frontier(*c), nil
	}
	f := Frontier{Tick: cs[0].Tick, TierUp: 0xff}
	for l := range NumPipelines {
		f.Pipelines[l].Base = cs[0].Pipelines[l].Base
		f.Pipelines[l].Done = cs[0].Pipelines[l].Done
	}
	// NB: by index and pointer: a Contribution is about 470 bytes.
	for r := range cs {
		c := &cs[r]
		if err := c.check(); err != nil {
			return Frontier{}, fmt.Errorf("reduce: rank %d: %w", r, err)
		}
		if c.Tick != f.Tick {
			return Frontier{}, fmt.Errorf("reduce: rank %d is at tick %d, rank 0 at %d: %w", r, c.Tick, f.Tick, ErrFrontier)
		}
		f.TierUp &= c.TierUp
		for l := range NumPipelines {
			p := &c.Pipelines[l]
			if p.Base != f.Pipelines[l].Base {
				return Frontier{}, fmt.Errorf("reduce: rank %d pipeline %s base %d, rank 0 base %d: %w", r, Pipeline(l), p.Base, f.Pipelines[l].Base, ErrFrontier)
			}
			f.Pipelines[l].Done = min(f.Pipelines[l].Done, p.Done)
		}
	}
	total := 0
	for l := range NumPipelines {
		total += int(f.Pipelines[l].Done - f.Pipelines[l].Base)
	}
	// NB: one array for every pipeline's ok bits.
	oks := make([]bool, total)
	for l := range NumPipelines {
		fl := &f.Pipelines[l]
		n := int(fl.Done - fl.Base)
		fl.OK, oks = oks[:n:n], oks[n:]
		for i := range fl.OK {
			fl.OK[i] = true
		}
		if Pipeline(l) == PipelineLookup {
			fl.Values = make([]int, n)
			for i := range fl.Values {
				fl.Values[i] = int(^uint(0) >> 1)
			}
		}
		for r := range cs {
			p := &cs[r].Pipelines[l]
			for i := range n {
				fl.OK[i] = fl.OK[i] && p.OK[i]
				if fl.Values != nil {
					fl.Values[i] = min(fl.Values[i], p.Values[i])
				}
			}
		}
	}
	return f, nil
}

func (c *Contribution) check() error {
	for l := range NumPipelines {
		p := &c.Pipelines[l]
		if p.Done < p.Base {
			return fmt.Errorf("pipeline %s done %d below base %d: %w", Pipeline(l), p.Done, p.Base, ErrFrontier)
		}
		n := p.Done - p.Base
		if uint64(len(p.OK)) != n {
			return fmt.Errorf("pipeline %s: %d ok bits for %d ops: %w", Pipeline(l), len(p.OK), n, ErrFrontier)
		}
		want := uint64(0)
		if Pipeline(l) == PipelineLookup {
			want = n
		}
		if uint64(len(p.Values)) != want {
			return fmt.Errorf("pipeline %s: %d values for %d ops: %w", Pipeline(l), len(p.Values), want, ErrFrontier)
		}
	}
	return nil
}

// String renders the progress compactly, pipelines with nothing new left out:
// "tick=3 backup=0..2[ok,fail] lookup=1..2[ok:3]".
func (f Frontier) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tick=%d", f.Tick)
	for l := range NumPipelines {
		p := f.Pipelines[l]
		if p.Done == p.Base {
			continue
		}
		fmt.Fprintf(&b, " %s=%d..%d[", Pipeline(l), p.Base, p.Done)
		for i, ok := range p.OK {
			if i > 0 {
				b.WriteByte(',')
			}
			if ok {
				b.WriteString("ok")
			} else {
				b.WriteString("fail")
			}
			if p.Values != nil {
				fmt.Fprintf(&b, ":%d", p.Values[i])
			}
		}
		b.WriteByte(']')
	}
	if f.TierUp != 0xff {
		fmt.Fprintf(&b, " tier_up=%08b", f.TierUp)
	}
	return b.String()
}
