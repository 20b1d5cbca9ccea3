package control

// counter names a count of something that happened (not a skip); the
// names are what Stats prints.
type counter uint8

const (
	cBackup counter = iota
	cFlush
	cL1Admit
	cL1EvictAhead
	cL1EvictDrop
	cL1EvictToL2
	cL1EvictWriteBack
	cL1Plan
	cL1PlanError
	cL2EvictAhead
	cL2EvictDurable
	cL2EvictNotDurable
	cLoadBack
	cReloadAbandoned
	cReloadAbortedNoWaiters
	cReloadAnchorLost
	cReloadDuplicate
	cReloadFailed
	cReloadGet
	cReloadJoined
	cReloadLanded
	cReloadLookup
	cReloadMiss
	cSpill
	cSpillDequeuedByEviction
	cSpillDurable
	cWriteBackKeptL1OfALockedNode
	cUpcomingProtected
	cUpcomingFull
	cUpcomingRefused
	cPrefetchLookup
	cPrefetchBusy
	cPrefetchMiss
	numCounters
)

var counterNames = [numCounters]string{
	cBackup:                       "backup",
	cFlush:                        "flush",
	cL1Admit:                      "l1 admit",
	cL1EvictAhead:                 "l1 evict ahead",
	cL1EvictDrop:                  "l1 evict drop",
	cL1EvictToL2:                  "l1 evict to l2",
	cL1EvictWriteBack:             "l1 evict write-back",
	cL1Plan:                       "l1 plan",
	cL1PlanError:                  "l1 plan error",
	cL2EvictAhead:                 "l2 evict ahead",
	cL2EvictDurable:               "l2 evict durable",
	cL2EvictNotDurable:            "l2 evict not durable",
	cLoadBack:                     "load-back",
	cReloadAbandoned:              "reload abandoned",
	cReloadAbortedNoWaiters:       "reload aborted: no waiters",
	cReloadAnchorLost:             "reload anchor lost",
	cReloadDuplicate:              "reload duplicate",
	cReloadFailed:                 "reload failed",
	cReloadGet:                    "reload get",
	cReloadJoined:                 "reload joined",
	cReloadLanded:                 "reload landed",
	cReloadLookup:                 "reload lookup",
	cReloadMiss:                   "reload miss",
	cSpill:                        "spill",
	cSpillDequeuedByEviction:      "spill dequeued by eviction",
	cSpillDurable:                 "spill durable",
	cWriteBackKeptL1OfALockedNode: "write-back kept L1 of a locked node",
	cUpcomingProtected:            "upcoming protected",
	cUpcomingFull:                 "upcoming full",
	cUpcomingRefused:              "upcoming refused",
	cPrefetchLookup:               "prefetch lookup",
	cPrefetchBusy:                 "prefetch busy",
	cPrefetchMiss:                 "prefetch miss",
}
