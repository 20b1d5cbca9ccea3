package host

import (
	"context"
	"fmt"
	"math"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/control"
)

// tierBits is the number of ok bits that carry a contribution's TierUp
// (ANDed like every ok bit).
const tierBits = 8

// ConsensusGroup runs a Node's exchanges over a host/consensus transport
// (inproc, tcpgroup, enginegroup, simgroup): it encodes the Machine's
// contribution into the group's fixed-shape vector and decodes the
// frontier back. The shape is computed from replicated state only (the
// ops issued and not yet applied per pipeline, the digest interval), so
// every rank sends the same shape whatever it finished:
//
//   - counts: class 0 = {gathered: gather pipeline, durable: durable
//     pipeline, reloaded: reload pipeline, l1copied: backup pipeline},
//     class 1 = {l1copied: load-back pipeline, reloaded: lookup pipeline},
//     each the absolute number of the pipeline's ops this rank finished
//     (MIN over ranks: the group's);
//   - ok bits: one per op issued and not applied, pipeline by pipeline in
//     pipeline order (true for an op this rank has not finished: the
//     neutral element of AND), then 8 bits of TierUp;
//   - reload prefixes: one per lookup op issued and not applied (MaxUint32
//     while unfinished: the neutral element of MIN);
//   - on ticks that are multiples of DigestEvery, the Machine's digest and
//     its four structure digests, compared across ranks: a mismatch stops
//     the group naming the tick, both ranks and the first structure.
type ConsensusGroup struct {
	// G is the rank's member of the group.
	G consensus.Group
	// M is the rank's Machine (its replicated state sizes the vector).
	M *control.Machine
	// DigestEvery offers digests on ticks that are its multiples (0:
	// none).
	DigestEvery uint64
}

// Exchange implements Group.
func (g ConsensusGroup) Exchange(ctx context.Context, tick uint64, c control.Contribution) (control.Frontier, error) {
	ops := g.M.PipelineOps()
	cc, err := EncodeContribution(c, ops, g.digestTick(tick), g.M)
	if err != nil {
		return control.Frontier{}, err
	}
	f, err := g.G.Exchange(ctx, tick, cc)
	if err != nil {
		return control.Frontier{}, err
	}
	return DecodeFrontier(c, ops, f)
}

func (g ConsensusGroup) digestTick(tick uint64) bool {
	return g.DigestEvery > 0 && tick%g.DigestEvery == 0
}

// EncodeContribution is the consensus vector of c (see ConsensusGroup);
// ops are the Machine's PipelineOps, m supplies the digests when digest is
// set (nil: none).
func EncodeContribution(c control.Contribution, ops [control.NumPipelines]int, digest bool, m *control.Machine) (consensus.Contribution, error) {
	bits := 0
	for l := range control.NumPipelines {
		p := c.Pipelines[l]
		if p.Done < p.Base || p.Done-p.Base > uint64(ops[l]) {
			return consensus.Contribution{}, fmt.Errorf("host: contribution pipeline %s done %d, base %d, %d ops issued: %w", control.Pipeline(l), p.Done, p.Base, ops[l], control.ErrFrontier)
		}
		bits += ops[l]
	}
	s := consensus.Shape{Classes: 2, OKBits: bits + tierBits, Reloads: ops[control.PipelineLookup]}
	if digest && m != nil {
		s.Digest, s.Structures = true, int(consensus.NumStructures)
	}
	out := consensus.NewContribution(c.Tick, s)
	pl := &c.Pipelines
	out.Counts[0] = consensus.Counts{Gathered: pl[control.PipelineGather].Done, Durable: pl[control.PipelineDurable].Done,
		Reloaded: pl[control.PipelineReload].Done, L1Copied: pl[control.PipelineBackup].Done}
	out.Counts[1] = consensus.Counts{L1Copied: pl[control.PipelineLoadBack].Done, Reloaded: pl[control.PipelineLookup].Done}
	at := 0
	for l := range control.NumPipelines {
		copy(out.OK[at:at+ops[l]], pl[l].OK)
		at += ops[l]
	}
	for t := range tierBits {
		out.OK[at+t] = c.TierUp>>t&1 == 1
	}
	for i := range out.Prefix {
		out.Prefix[i] = math.MaxUint32
	}
	for i, v := range pl[control.PipelineLookup].Values {
		out.Prefix[i] = uint32(min(max(v, 0), math.MaxUint32-1))
	}
	if s.Digest {
		out.Digest = m.Digest()
		sd := m.StructureDigests()
		for i := range out.Structures {
			out.Structures[i] = sd[i]
		}
	}
	return out, nil
}

// DecodeFrontier turns the group's frontier back into the Machine's,
// checking it against the rank's own contribution c and its PipelineOps.
func DecodeFrontier(c control.Contribution, ops [control.NumPipelines]int, f consensus.Frontier) (control.Frontier, error) {
	if err := f.Check(); err != nil {
		return control.Frontier{}, fmt.Errorf("host: frontier at tick %d: %w", f.Tick, err)
	}
	bits := 0
	for _, n := range ops {
		bits += n
	}
	if f.Tick != c.Tick || f.Shape.Classes != 2 || f.Shape.OKBits != bits+tierBits || f.Shape.Reloads != ops[control.PipelineLookup] {
		return control.Frontier{}, fmt.Errorf("host: frontier at tick %d shape %s, rank at tick %d expects classes=2 ok=%d reloads=%d: %w",
			f.Tick, f.Shape, c.Tick, bits+tierBits, ops[control.PipelineLookup], control.ErrFrontier)
	}
	done := [control.NumPipelines]uint64{
		control.PipelineBackup: f.Counts[0].L1Copied, control.PipelineLoadBack: f.Counts[1].L1Copied,
		control.PipelineGather: f.Counts[0].Gathered, control.PipelineDurable: f.Counts[0].Durable,
		control.PipelineLookup: f.Counts[1].Reloaded, control.PipelineReload: f.Counts[0].Reloaded,
	}
	out := control.Frontier{Tick: f.Tick}
	at := 0
	for l := range control.NumPipelines {
		base := c.Pipelines[l].Base
		if done[l] < base || done[l]-base > uint64(ops[l]) {
			return control.Frontier{}, fmt.Errorf("host: frontier at tick %d pipeline %s done %d, base %d, %d ops issued: %w", f.Tick, control.Pipeline(l), done[l], base, ops[l], control.ErrFrontier)
		}
		n := int(done[l] - base)
		p := control.PipelineProgress{Base: base, Done: done[l], OK: append([]bool(nil), f.OK[at:at+n]...)}
		if control.Pipeline(l) == control.PipelineLookup {
			p.Values = make([]int, n)
			for i := range n {
				if f.Prefix[i] == math.MaxUint32 {
					return control.Frontier{}, fmt.Errorf("host: frontier at tick %d: lookup %d done without a prefix: %w", f.Tick, i, control.ErrFrontier)
				}
				p.Values[i] = int(f.Prefix[i])
			}
		}
		out.Pipelines[l] = p
		at += ops[l]
	}
	for t := range tierBits {
		if f.OK[at+t] {
			out.TierUp |= 1 << t
		}
	}
	return out, nil
}
