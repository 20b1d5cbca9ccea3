package control

import (
	"fmt"

	"github.com/kvtier/kvtier/internal/invariants"
)

// pipelineOrder is the order Tick applies pipelines in: copies first (they
// free or fill tiers), then the spill's two stages (gathered before durable),
// then lookups and the reloads they started.
var pipelineOrder = [NumPipelines]Pipeline{PipelineBackup, PipelineLoadBack, PipelineGather, PipelineDurable, PipelineLookup, PipelineReload}

// Tick applies a frontier, the one place where local facts become
// replicated: per pipeline, the ops the whole group finished are committed or
// rolled back in issue order; held requests past their TTL are released;
// queued spills are issued; every DigestEvery ticks the digest goes to
// Ready. A frontier that does not fit the Machine (another tick, another
// base, more ops than were issued, a bad shape) is refused with
// ErrFrontier and changes nothing.
func (m *Machine) Tick(f Frontier) error {
	if err := m.checkFrontier(&f); err != nil {
		return err
	}
	m.tick++
	m.tierDown = ^f.TierUp
	for _, l := range pipelineOrder {
		p := &f.Pipelines[l]
		n := int(p.Done - m.applied[l])
		// NB: the applied ids are copied out and the rest moved to the
		// front, so that the pipeline's array is reused instead of sliding
		// off its end (an op issued while applying appends to it).
		m.tickIDs = append(m.tickIDs[:0], m.pipelines[l][:n]...)
		ids := m.tickIDs
		m.pipelines[l] = m.pipelines[l][:copy(m.pipelines[l], m.pipelines[l][n:])]
		m.applied[l] = p.Done
		for i, id := range ids {
			o := m.ops.Get(id)
			switch l {
			case PipelineBackup:
				m.applyBackup(o, p.OK[i])
			case PipelineLoadBack:
				m.applyLoadBack(o, p.OK[i])
			case PipelineGather:
				m.applyGather(o, p.OK[i])
			case PipelineDurable:
				m.applyDurable(o, p.OK[i])
			case PipelineLookup:
				m.applyLookup(o, p.Values[i])
			case PipelineReload:
				if err := m.applyReload(o, p.OK[i]); err != nil {
					return err
				}
			}
		}
	}
	m.recycleOps()
	m.expireHolds()
	m.issueSpills()
	if invariants.Enabled {
		if err := m.CheckInvariants(); err != nil {
			return fmt.Errorf("control: after tick %d: %w", m.tick, err)
		}
	}
	if m.opts.DigestEvery > 0 && m.tick%m.opts.DigestEvery == 0 {
		d := m.Digest()
		m.out.digest = &d
	}
	return nil
}

func (m *Machine) checkFrontier(f *Frontier) error {
	if f.Tick != m.tick {
		return fmt.Errorf("control: frontier for tick %d, machine at tick %d: %w", f.Tick, m.tick, ErrFrontier)
	}
	if err := (*Contribution)(f).check(); err != nil {
		return fmt.Errorf("control: frontier: %w", err)
	}
	for l := range NumPipelines {
		p := &f.Pipelines[l]
		if p.Base != m.applied[l] {
			return fmt.Errorf("control: frontier pipeline %s base %d, machine applied %d: %w", Pipeline(l), p.Base, m.applied[l], ErrFrontier)
		}
		if p.Done-p.Base > uint64(len(m.pipelines[l])) {
			return fmt.Errorf("control: frontier pipeline %s done %d, only %d issued: %w", Pipeline(l), p.Done, m.applied[l]+uint64(len(m.pipelines[l])), ErrFrontier)
		}
		if Pipeline(l) == PipelineLookup {
			for i, v := range p.Values {
				o := m.ops.Get(m.pipelines[l][i])
				if v < 0 || v > len(o.hashes) {
					return fmt.Errorf("control: frontier lookup op %d: %d pages of %d: %w", o.id, v, len(o.hashes), ErrFrontier)
				}
			}
		}
	}
	// NB: a durable op must not be applied before its gathered stage; a
	// group's MIN keeps that order, a forged frontier might not.
	g := f.Pipelines[PipelineGather].Done
	if d := f.Pipelines[PipelineDurable].Done; d > g {
		return fmt.Errorf("control: frontier durable %d ahead of gathered %d: %w", d, g, ErrFrontier)
	}
	return nil
}
