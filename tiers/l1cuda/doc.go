// Package l1cuda holds kvtier's L1 device page pools, three
// implementations of Pool v1 (tiers.Pool):
//
//   - host: pages in host memory with the engine's layer-first layout, for
//     machines without a GPU and for tests; copies to and from
//     page-contiguous slab spans go through internal/memcopy's strided
//     gather and scatter;
//   - engine: kvtier plans the copies and the engine runs them (as vLLM's
//     offload path does) and reports each finished item back; kvtier links
//     no CUDA;
//   - cuda: kvtier copies itself through libcudart, loaded at run time with
//     ebitengine/purego (no cgo, no GPU needed to build or test): the slab
//     registered once per slab under a per-call ceiling, the engine's KV
//     memory opened from CUDA IPC handles, copies on one stream fenced by
//     events.
//
// The layer-first layout: a pool of P pages and L layers stores kind k as
// L runs of P slices of page_bytes(k)/L bytes, so the slice of layer l of
// page p lies at (l*P + p) * slice. A slab span holds the page's L slices
// back to back. Every pool of this package uses it, so one slab span means
// the same bytes whichever pool moved it.
//
// All three share the ack queue of Pool v1: batch ids from 1, one ack per
// item (AckCopied or AckFailed) drained by the host at its ticks. A pool
// never decides what L1 holds; the control machine does. A pool whose
// configured fast path cannot run fails at open with the reason; none
// falls back silently.
package l1cuda
