package policy

import "github.com/kvtier/kvtier/registry"

// PlannerV1 is the role ID of Planner v1.
const PlannerV1 registry.TypeID = "kvtier.policy.planner.v1"

// PlannerFactory builds a fresh planner. A planner holds scratch space
// between calls, so each Machine (rank) gets its own.
type PlannerFactory func() Planner

// PlannerRegistration is a planner module's registry entry.
type PlannerRegistration = registry.Registration[PlannerFactory]

// PlannerRegistry is the planner registry of one host. Planners register
// apart from evictors because their factories differ; both are chosen by
// name under the `policy` block of a stack config.
type PlannerRegistry = registry.Registry[PlannerFactory]

// NewPlannerRegistry returns an empty planner registry.
func NewPlannerRegistry() *PlannerRegistry { return registry.New[PlannerFactory]() }

// PlanNode is one node a Planner may choose as a victim: an evictable leaf
// now, or an ancestor that becomes one once every child is planned away.
type PlanNode struct {
	// ID is the node's id; ids are unique within one PlanInput.
	ID NodeID
	// Parent is the parent's id (0 for children of the root). A parent
	// missing from the input is never planned.
	Parent NodeID
	// Children is the node's number of live children in the tree,
	// including children absent from the input (those are never planned,
	// so the node never becomes a leaf).
	Children int
	// Evictable says the node carries no request lock and no
	// backup-pending marker: it may be evicted once it is a leaf.
	Evictable bool
	// Counts[o] is how many of the node's pages owner lane o holds
	// (owner(i) = i mod cp_size); len(Counts) = cp_size.
	Counts []int
	// Priority is the evictor's order among equally useful victims:
	// lower is evicted first (e.g. slru's protected bit, then last access).
	Priority uint64
}

// PlanInput is one planning call: what each owner lane must free and the
// nodes that may free it. It holds replicated state only.
type PlanInput struct {
	// Deficits[o] is how many pages owner lane o must free; len = cp_size.
	Deficits []int
	// Nodes are the candidates and their plannable ancestors, in any order.
	Nodes []PlanNode
}

// Plan is a Planner's answer.
type Plan struct {
	// Victims are the nodes to evict, in order; each is a leaf once the
	// victims before it are gone.
	Victims []NodeID
	// Freed[o] is the pages owner lane o gets back from the victims.
	Freed []int
	// Remaining[o] = max(0, Deficits[o] - Freed[o]).
	Remaining []int
}

// Planner v1 chooses owner-lane eviction victims leaf-up.
//
// A node is a candidate only while it is an evictable leaf; when the last
// planned child of an evictable parent leaves, the parent becomes one. Each
// step takes the candidate with the least score
//
//	(-contribution, -ancestor_unlock, Priority, ID)
//
// where contribution = Σ_o min(Counts[o], deficit[o]) over the current
// deficits, and ancestor_unlock is the parent's contribution when evicting
// the candidate would make its evictable parent a leaf (0 otherwise). The
// victim's pages are subtracted from the deficits (clamped at 0). Planning
// stops when every deficit is met, when no candidate is left, or when the
// best candidate has zero contribution and zero unlock. The result is a
// function of the input alone: every rank computes the same plan.
//
// A Planner may keep scratch space between calls, so one value must not
// plan concurrently with itself.
type Planner interface {
	// Name returns the planner's name ("greedy", "heap").
	Name() string
	// Plan computes the victims for in. Malformed input (lane counts that
	// disagree, duplicate ids, negative pages, more planned children than
	// a parent has) is an error; nothing is planned then.
	Plan(in PlanInput) (Plan, error)
}
