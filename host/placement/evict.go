package placement

import (
	"fmt"

	"github.com/kvtier/kvtier/tiers"
)

// ExhaustedError reports a reservation that does not fit even after every
// victim offered is counted. It wraps ErrNoSpace. Nothing was changed.
type ExhaustedError struct {
	// Object and Pages describe the reservation.
	Object ObjectID
	Pages  int64
	// Kind is the first payload kind that stayed short.
	Kind tiers.PayloadKind
	// Free is that kind's free pages; Reclaimable is what releasing every
	// victim would have added to it.
	Free, Reclaimable int64
	// Victims is the number of victims offered.
	Victims int
}

// Error describes the shortfall.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("reserve object %d: need %d pages of kind %d, %d free + %d reclaimable from %d victims: %v",
		e.Object, e.Pages, e.Kind, e.Free, e.Reclaimable, e.Victims, ErrNoSpace)
}

// Unwrap returns ErrNoSpace.
func (e *ExhaustedError) Unwrap() error { return ErrNoSpace }

// EvictToFit reserves an object like Reserve, releasing victims first when
// it does not fit. victims is the policy's order, coldest first, of the
// objects the host may evict (committed, unpinned); EvictToFit releases
// them one at a time in that order and retries after each, stopping at the
// first fit, and returns how many it released: victims[:evicted] are gone
// and the caller tears down what they backed.
//
// Because a reservation fits exactly when every kind has enough free pages
// (an object may span several free ranges), the retry is decided by
// counting, before anything is released: if even releasing every victim
// would not make room, EvictToFit releases nothing and returns an
// *ExhaustedError. It never loops beyond len(victims).
//
// When the reservation fits as it is, victims are not looked at. Otherwise
// every victim must be a distinct committed object other than id; a victim
// that is not is a caller bug, reported (wrapping ErrUnknownObject,
// ErrNotCommitted or ErrInvalid) before anything changes.
func (a *Allocator) EvictToFit(id ObjectID, pages int64, kinds Kinds, victims []ObjectID) (evicted int, err error) {
	if err := a.checkArgs("reserve", id, pages, kinds); err != nil {
		return 0, err
	}
	// Deficit per kind in kinds; positive means short.
	var deficit [MaxKinds]int64
	short := 0
	for k := range a.free {
		if kinds&(1<<k) != 0 {
			deficit[k] = pages - a.free[k].pages
			if deficit[k] > 0 {
				short++
			}
		}
	}
	if short == 0 {
		a.place(id, pages, kinds)
		a.checkInvariants("evict-to-fit")
		return 0, nil
	}
	// NB: a victim listed twice is found by marking each victim with the
	// number of this call, not with a set built per call.
	a.evictions++
	fitAt := -1
	for i, v := range victims {
		o := a.objects[v]
		switch {
		case v == id:
			return 0, fmt.Errorf("reserve object %d: victim %d is the object itself: %w", id, i, ErrInvalid)
		case o == nil:
			return 0, fmt.Errorf("reserve object %d: victim %d (object %d): %w", id, i, v, ErrUnknownObject)
		case !o.committed:
			return 0, fmt.Errorf("reserve object %d: victim %d (object %d): %w", id, i, v, ErrNotCommitted)
		}
		if o.victimOf == a.evictions {
			return 0, fmt.Errorf("reserve object %d: victim %d (object %d) listed twice: %w", id, i, v, ErrInvalid)
		}
		o.victimOf = a.evictions
		if fitAt >= 0 {
			continue // keep validating the rest; it is cheap and catches bugs early
		}
		for k := range a.free {
			if kinds&(1<<k) != 0 && o.kinds&(1<<k) != 0 {
				before := deficit[k]
				deficit[k] -= o.pages
				if before > 0 && deficit[k] <= 0 {
					short--
				}
			}
		}
		if short == 0 {
			fitAt = i + 1
		}
	}
	if fitAt < 0 {
		e := &ExhaustedError{Object: id, Pages: pages, Victims: len(victims)}
		for k := range a.free {
			if kinds&(1<<k) != 0 && deficit[k] > 0 {
				e.Kind = tiers.PayloadKind(k)
				e.Free = a.free[k].pages
				e.Reclaimable = pages - a.free[k].pages - deficit[k]
				break
			}
		}
		return 0, e
	}
	for _, v := range victims[:fitAt] {
		a.drop(a.objects[v])
	}
	a.place(id, pages, kinds)
	a.checkInvariants("evict-to-fit")
	return fitAt, nil
}
