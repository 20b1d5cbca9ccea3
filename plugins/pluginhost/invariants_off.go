//go:build !(invariants || race)

package pluginhost

// invariants enables the expensive self-checks of the ack bookkeeping.
const invariants = false
