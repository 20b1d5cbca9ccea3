package l3disk

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/kvtier/kvtier/indexes"
)

// repair applies CheckOptions.Repair to what Check found: it rebuilds the
// index from the verified slots when asked to or when the index cannot be
// trusted (corrupt, set aside at open, or naming none of the pages), and
// otherwise deletes the entries that name no valid slot.
func repair(ctx context.Context, opts CheckOptions, rep *CheckReport, files map[fileKey]*checkedFile, bad []indexes.Entry, log *slog.Logger) error {
	if !opts.RebuildIndex && rep.IndexCorrupt == "" && !rep.AllOrphans && len(rep.Unfinished) == 0 {
		n, err := deleteEntries(ctx, opts.Index, bad)
		rep.Repaired += n
		if err != nil {
			return fmt.Errorf("l3 check: repair: %w", err)
		}
		return nil
	}
	start := time.Now()
	if r, ok := opts.Index.(indexes.Resetter); ok && rep.IndexCorrupt != "" {
		// NB: a corrupt index cannot be trusted to iterate, so the
		// entries of other disks or stacks go too; they become misses.
		if err := r.Reset(ctx); err != nil {
			return fmt.Errorf("l3 check: rebuild: reset index: %w", err)
		}
	} else {
		var own []indexes.Entry
		err := opts.Index.Iterate(ctx, func(e indexes.Entry) error {
			k := fileKey{int(e.Record.Disk), epochRank(e.Record.Epoch), e.Key.Kind}
			if _, ok := files[k]; ok || (opts.StackID == "" && int(e.Record.Disk) < len(opts.Dirs)) {
				own = append(own, e)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("l3 check: rebuild: the index cannot be reset and fails to iterate: %w", err)
		}
		n, err := deleteEntries(ctx, opts.Index, own)
		rep.Repaired += n
		if err != nil {
			return fmt.Errorf("l3 check: rebuild: %w", err)
		}
	}
	rc := &rep.Rebuilt
	for k, c := range files {
		if _, err := indexVerified(ctx, opts.Index, c.f, k.disk, &c.scan, rc); err != nil {
			return fmt.Errorf("l3 check: rebuild: %w", err)
		}
	}
	if len(rep.Unfinished) > 0 {
		// NB: the marks go only once what the rebuild wrote is durable.
		if d, ok := opts.Index.(indexes.DeferredPutter); ok {
			if err := d.Sync(ctx); err != nil {
				return fmt.Errorf("l3 check: rebuild: %w", err)
			}
		}
		for _, m := range rep.Unfinished {
			if err := opts.FS.Remove(m); err != nil {
				return fmt.Errorf("l3 check: rebuild: remove the mark of the unfinished rebuild: %w", err)
			}
			if err := opts.FS.SyncDir(filepath.Dir(m)); err != nil {
				return fmt.Errorf("l3 check: rebuild: %w", err)
			}
		}
	}
	rc.Elapsed = time.Since(start)
	log.Warn("l3 check: index rebuilt from the slot headers", "pages_kept", rc.Kept, "corrupt_slots", rc.Corrupt,
		"duplicate_slots", rc.Duplicates, "unreadable_slots", rc.Unreadable)
	return nil
}

// deleteEntries deletes entries (only where the index still holds the
// same record) in batches and counts what went.
func deleteEntries(ctx context.Context, ix indexes.Index, entries []indexes.Entry) (int64, error) {
	var n int64
	for len(entries) > 0 {
		part := entries[:min(len(entries), 1024)]
		entries = entries[len(part):]
		deleted := make([]bool, len(part))
		if err := ix.DeleteIf(ctx, part, deleted); err != nil {
			return n, fmt.Errorf("delete %d entries: %w", len(part), err)
		}
		for _, d := range deleted {
			if d {
				n++
			}
		}
	}
	return n, nil
}
