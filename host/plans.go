package host

import (
	"errors"

	"github.com/kvtier/kvtier/host/stack"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l1cuda"
)

// PlannedCopy is one copy of a plan the engine runs: item Index of batch
// Batch, to the slab (ToSlab) or from it.
type PlannedCopy = l1cuda.PlannedCopy

// planPool is the ability of an L1 pool whose copies the engine runs from
// plans (tiers/l1cuda's engine pool, `use: engine`): the pool only plans
// the Machine's L1<->L2 copies, and the engine's reports become its acks.
type planPool interface {
	TakePlans(dst []PlannedCopy) []PlannedCopy
	Outstanding(id tiers.BatchID) bool
	CompleteBatch(id tiers.BatchID, why error) error
	FailPending(why error) int
}

// ErrNoPlans is returned by the plan calls of a Node whose L1 pool runs
// its copies itself (RunsPlans is false).
var ErrNoPlans = errors.New("host: the L1 pool runs its own copies; it makes no plans")

// RunsPlans reports whether the stack's L1 pool is one whose copies the
// engine runs from plans (a Node over it answers TakePlans,
// PlanOutstanding, CompletePlan and FailPlans).
func RunsPlans(s *stack.Stack) bool {
	_, ok := s.Pool.(planPool)
	return ok
}

// TakePlans appends the copies planned since the last call, in plan order
// (a batch's items together), to dst.
func (n *Node) TakePlans(dst []PlannedCopy) []PlannedCopy {
	if n.plans == nil {
		return dst
	}
	return n.plans.TakePlans(dst)
}

// PlanOutstanding reports whether plan id was made and not yet completed.
func (n *Node) PlanOutstanding(id tiers.BatchID) bool {
	return n.plans != nil && n.plans.Outstanding(id)
}

// CompletePlan reports every item of plan id finished (why nil) or failed;
// its acks reach the Machine at the next Drain. A plan with nothing
// outstanding is refused and changes nothing.
//
// sums, for a finished plan into the slab, are the engine's CRC-32C of
// each item's bytes as it wrote them, in item order, or none: the Node
// keeps them per L2 page and the Puts that spill those pages carry them
// (a page whose slab bytes change before the store gathers it then reads
// back from the store as a miss). Sums of a failed plan are ignored. Sums
// that do not fit the plan (ErrPlanSums) refuse the completion whole.
func (n *Node) CompletePlan(id tiers.BatchID, why error, sums []uint32) error {
	if n.plans == nil {
		return ErrNoPlans
	}
	b := n.pool[id]
	if err := checkPlanSums(id, b, sums); err != nil && n.plans.Outstanding(id) {
		return err
	}
	if err := n.plans.CompleteBatch(id, why); err != nil {
		return err
	}
	if why == nil && len(sums) > 0 && len(b.pages) == len(sums) {
		for i, pg := range b.pages {
			n.sums.set(pg, sums[i])
		}
	}
	return nil
}

// FailPlans fails every plan not yet completed (the engine that owed
// them went away), drops the plans not yet taken and returns how many
// plans it failed.
func (n *Node) FailPlans(why error) int {
	if n.plans == nil {
		return 0
	}
	return n.plans.FailPending(why)
}

// PoolReady returns a channel that receives a value whenever the L1 pool
// has acks for Drain.
func (n *Node) PoolReady() <-chan struct{} { return n.s.Pool.AckReady() }
