package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	badgerindex "github.com/kvtier/kvtier/indexes/badger"
	lmdbindex "github.com/kvtier/kvtier/indexes/lmdb"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// l3Tier is one l3disk tier of the stack.
type l3Tier struct {
	t config.Tier
	c *l3disk.Config
}

// l3Tiers returns the stack's l3disk tiers.
func l3Tiers(st *config.Stack) []l3Tier {
	var out []l3Tier
	for _, t := range st.Tiers {
		if t.Role != config.RoleStore || t.Use != l3disk.Name {
			continue
		}
		c, ok := t.Config.(*l3disk.Config)
		if !ok || c == nil {
			d := l3disk.DefaultConfig()
			c = &d
		}
		out = append(out, l3Tier{t: t, c: c})
	}
	return out
}

// noL3 is the result of the L3 checks for a stack without an l3disk tier.
func noL3() Result { return passf("the stack has no l3disk tier; nothing to check") }

// maxPathDepth bounds the walk up to an existing ancestor.
const maxPathDepth = 256

// existingDir returns dir, or when dir does not exist yet (the store
// creates it at open) its nearest existing ancestor: the file system the
// store's files will land on. missing says whether dir itself is absent.
func existingDir(sys System, dir string) (probe string, missing bool, err error) {
	p := filepath.Clean(dir)
	for range maxPathDepth {
		fi, err := sys.Stat(p)
		switch {
		case err == nil && fi.IsDir():
			return p, p != filepath.Clean(dir), nil
		case err == nil:
			return "", false, fmt.Errorf("%s is not a directory", p)
		case !errors.Is(err, fs.ErrNotExist):
			return "", false, err
		}
		up := filepath.Dir(p)
		if up == p {
			break
		}
		p = up
	}
	return "", false, fmt.Errorf("no existing directory above %s", dir)
}

// eachDisk runs fn on every disk of every l3disk tier and merges the
// results.
func eachDisk(e *env, fn func(lt l3Tier, i int, d l3disk.Disk) Result) Result {
	lts := l3Tiers(e.st)
	if len(lts) == 0 {
		return noL3()
	}
	var parts []Result
	for _, lt := range lts {
		for i, d := range lt.c.Disks {
			r := fn(lt, i, d)
			if r.Detail == nil {
				r.Detail = map[string]any{}
			}
			r.Detail["tier"], r.Detail["disk"], r.Detail["dir"] = lt.t.Name, i, d.Dir
			parts = append(parts, r)
		}
	}
	return merge("disks", parts)
}

// checkODirect writes one aligned block with O_DIRECT on each L3 disk.
func checkODirect(_ context.Context, e *env) Result {
	return eachDisk(e, func(lt l3Tier, i int, d l3disk.Disk) Result {
		detail := map[string]any{"o_direct": lt.c.ODirect}
		if lt.c.ODirect == l3disk.ODirectOff {
			return passf("%s: o_direct: off in tier %q, buffered I/O with fdatasync by choice; not probed", d.Dir, lt.t.Name).with(detail)
		}
		dir, missing, err := existingDir(e.sys, d.Dir)
		if err != nil {
			return failf("%s: %v: fix $.tiers[%s].config.disks[%d].dir", d.Dir, err, lt.t.Name, i).with(detail)
		}
		detail["probed_dir"] = dir
		where := d.Dir
		if missing {
			where = fmt.Sprintf("%s (absent; serve creates it; probed %s)", d.Dir, dir)
		}
		err = e.sys.ProbeODirect(dir)
		switch {
		case err == nil:
			detail["direct"] = true
			return passf("%s: O_DIRECT 4 KiB write ok", where).with(detail)
		case errors.Is(err, diskfs.ErrDirectRefused) && lt.c.ODirect == l3disk.ODirectAuto:
			detail["direct"] = false
			return warnf("%s: the file system refuses O_DIRECT (tmpfs, some FUSE and network file systems): the store falls back to buffered I/O with fdatasync, slower and doubling pages in the page cache; put the disk on ext4 or xfs", where).with(detail)
		case errors.Is(err, diskfs.ErrDirectRefused):
			detail["direct"] = false
			return failf("%s: the file system refuses O_DIRECT and tier %q has o_direct: on, so serve will refuse to open it; put the disk on ext4 or xfs, or set o_direct: auto", where, lt.t.Name).with(detail)
		}
		return failf("%s: cannot write a scratch file (%v): serve must be able to create files there; check ownership and permissions (chown the directory to the serve user) and that the file system is mounted read-write", where, err).with(detail)
	})
}

// defaultPLPProbes is the probe count when a config skips the store's own
// probe (plp_probes: 0): the doctor measures anyway.
const defaultPLPProbes = 8

// checkPLP runs the power-loss-protection probe on each L3 disk.
func checkPLP(_ context.Context, e *env) Result {
	return eachDisk(e, func(lt l3Tier, i int, d l3disk.Disk) Result {
		probes := lt.c.PLPProbes
		if probes <= 0 {
			probes = defaultPLPProbes
		}
		detail := map[string]any{"require_plp": lt.c.RequirePLP, "max_sync_ns": lt.c.PLPMaxSync.Nanoseconds(), "probes": probes}
		dir, _, err := existingDir(e.sys, d.Dir)
		if err != nil {
			return failf("%s: %v: fix $.tiers[%s].config.disks[%d].dir", d.Dir, err, lt.t.Name, i).with(detail)
		}
		detail["probed_dir"] = dir
		if st, err := e.sys.Statfs(dir); err == nil && (st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC) {
			// NB: fdatasync on memory returns at once, so the probe would
			// call it protected; nothing there survives a reboot.
			detail["memory_fs"] = true
			msg := fmt.Sprintf("%s is on a memory file system (tmpfs or ramfs): nothing there survives a reboot or power loss, whatever fdatasync says", d.Dir)
			if lt.c.RequirePLP {
				return failf("%s, and tier %q has require_plp: true; put the disk on a real device", msg, lt.t.Name).with(detail)
			}
			return warnf("%s; put the disk on a real device unless L3 is meant to be volatile", msg).with(detail)
		}
		res, err := e.sys.ProbePLP(dir, probes, lt.c.ODirect, lt.c.PLPMaxSync)
		if err != nil {
			return failf("%s: the power-loss probe failed (%v): serve must be able to write and fdatasync there", d.Dir, err).with(detail)
		}
		res.Median, res.Max = res.Median.Round(time.Microsecond), res.Max.Round(time.Microsecond)
		detail["median_ns"], detail["max_ns"], detail["direct"], detail["protected"] = res.Median.Nanoseconds(), res.Max.Nanoseconds(), res.Direct, res.Protected
		if res.Protected {
			return passf("%s: 4 KiB write+fdatasync median %v (limit %v): power-loss protected", d.Dir, res.Median, lt.c.PLPMaxSync).with(detail)
		}
		msg := fmt.Sprintf("%s: 4 KiB write+fdatasync median %v, above plp_max_sync %v: the disk is probably not power-loss protected, so every durable spill waits for the media", d.Dir, res.Median, lt.c.PLPMaxSync)
		if lt.c.RequirePLP {
			return failf("%s, and tier %q has require_plp: true, so serve will refuse to open it; use a disk with power-loss protection (a datacenter SSD), or set require_plp: false", msg, lt.t.Name).with(detail)
		}
		return warnf("%s; use a disk with power-loss protection (a datacenter SSD) for L3, or raise plp_max_sync if this latency is acceptable", msg).with(detail)
	})
}

// ranksOnDisk returns how many ranks of the group use disk d.
func ranksOnDisk(c *l3disk.Config, d, worldSize int) (int, error) {
	if len(c.RankDisks) > 0 {
		if _, _, err := c.DiskForRank(0, worldSize); err != nil {
			return 0, err
		}
		n := 0
		for _, x := range c.RankDisks {
			if x == d {
				n++
			}
		}
		return n, nil
	}
	n := len(c.Disks)
	if n == 0 {
		return 0, fmt.Errorf("l3disk config: no disks configured")
	}
	r := worldSize / n
	if d < worldSize%n {
		r++
	}
	return r, nil
}

// diskNeed returns the bytes the store may take on disk d: its budget, or
// with slots and no budget what the slots of its ranks take.
func diskNeed(st *config.Stack, c *l3disk.Config, d int) (need int64, slots int64, ranks int, err error) {
	ranks, err = ranksOnDisk(c, d, st.Ranks.WorldSize)
	if err != nil || ranks == 0 {
		return 0, 0, ranks, err
	}
	slots, err = c.SlotsPerKind(d, ranks, st.Payload)
	if err != nil {
		return 0, 0, ranks, err
	}
	if b := int64(c.Disks[d].Budget); b > 0 {
		return b, slots, ranks, nil
	}
	var perSet int64
	for _, k := range st.Payload.Kinds {
		perSet += l3disk.SlotBytes(k.PageBytes) + diskfs.BlockSize // a slot, and each file's superblock
	}
	return slots * perSet * int64(ranks), slots, ranks, nil
}

// l3SlabGlob matches the store's slab files in a disk directory; it
// follows l3disk.SlabFileName (a test keeps them in step).
const l3SlabGlob = "kvtier-l3-*-r*-k*.slab"

// fullWarn is the fill fraction of a file system, once the budgets are
// used, above which disk_free warns.
const fullWarn = 0.95

// checkDiskFree compares each L3 file system's free space with the
// budgets of the disks on it. Slab files already there (a previous run's)
// count as the store's own.
func checkDiskFree(_ context.Context, e *env) Result {
	lts := l3Tiers(e.st)
	if len(lts) == 0 {
		return noL3()
	}
	type fsUse struct {
		st        FSStat
		need      int64
		held      int64
		dirs      []string
		firstPath string
	}
	byDev := map[uint64]*fsUse{}
	var order []uint64
	var parts []Result
	for _, lt := range lts {
		for i, d := range lt.c.Disks {
			need, _, ranks, err := diskNeed(e.st, lt.c, i)
			if err != nil {
				parts = append(parts, failf("%s: %v", d.Dir, err).with(map[string]any{"tier": lt.t.Name, "dir": d.Dir}))
				continue
			}
			if ranks == 0 {
				continue
			}
			dir, missing, err := existingDir(e.sys, d.Dir)
			if err != nil {
				parts = append(parts, failf("%s: %v: fix $.tiers[%s].config.disks[%d].dir", d.Dir, err, lt.t.Name, i).with(map[string]any{"tier": lt.t.Name, "dir": d.Dir}))
				continue
			}
			st, err := e.sys.Statfs(dir)
			if err != nil {
				parts = append(parts, failf("%s: statfs: %v", d.Dir, err).with(map[string]any{"tier": lt.t.Name, "dir": d.Dir}))
				continue
			}
			var held int64
			if !missing {
				files, _ := e.sys.Glob(filepath.Join(dir, l3SlabGlob))
				for _, f := range files {
					if fi, err := e.sys.Stat(f); err == nil && fi.Mode().IsRegular() {
						held += fi.Size()
					}
				}
			}
			u := byDev[st.Device]
			if u == nil {
				u = &fsUse{st: st, firstPath: dir}
				byDev[st.Device] = u
				order = append(order, st.Device)
			}
			u.need += need
			u.held += held
			u.dirs = append(u.dirs, d.Dir)
		}
	}
	for _, dev := range order {
		u := byDev[dev]
		free := int64(u.st.Avail) * u.st.BlockSize
		total := int64(u.st.Blocks) * u.st.BlockSize
		short := max(0, u.need-u.held)
		detail := map[string]any{"dirs": u.dirs, "budget_bytes": u.need, "held_bytes": u.held, "free_bytes": free, "total_bytes": total}
		what := fmt.Sprintf("%v: budgets %s", u.dirs, human(u.need))
		if u.held > 0 {
			what += fmt.Sprintf(" (%s already in slab files)", human(u.held))
		}
		switch {
		case short > free:
			parts = append(parts, failf("%s, but only %s free on the file system of %s: free %s there or lower the budgets", what, human(free), u.firstPath, human(short-free)).with(detail))
		case total > 0 && float64(total-free+short) > fullWarn*float64(total):
			parts = append(parts, warnf("%s fit in %s free, but leave the file system of %s over %.0f%% full: other writers may fill it; lower the budgets or free space", what, human(free), u.firstPath, 100*fullWarn).with(detail))
		default:
			parts = append(parts, passf("%s fit in %s free", what, human(free)).with(detail))
		}
	}
	if len(parts) == 0 {
		return passf("no rank uses an L3 disk; nothing to check")
	}
	return merge("file_systems", parts)
}

// lmdbEntryBytes is the map an LMDB index entry takes: key and record and
// the B-tree's overhead (lmdb.Config's documented "about 100 bytes").
const lmdbEntryBytes = 100

// lmdbHeadroom is the margin below which lmdb_map_size warns: a B-tree
// with random inserts keeps pages partly empty and a commit copies the
// pages it changes.
const lmdbHeadroom = 1.25

// checkLMDBMapSize compares each LMDB index's map with the entries its
// store's slots can hold: one per slot of every kind, of every rank (all
// ranks of a node share the index).
func checkLMDBMapSize(_ context.Context, e *env) Result {
	lts := l3Tiers(e.st)
	if len(lts) == 0 {
		return noL3()
	}
	var parts []Result
	for _, lt := range lts {
		detail := map[string]any{"tier": lt.t.Name}
		ix := lt.t.Index
		switch {
		case ix == nil:
			parts = append(parts, passf("tier %q has no index", lt.t.Name).with(detail))
			continue
		case ix.Plugin != nil:
			parts = append(parts, passf("tier %q has a plugin index (%s); its capacity is the plugin's to check", lt.t.Name, ix.Plugin.Path).with(detail))
			continue
		case ix.Use == badgerindex.Name:
			parts = append(parts, passf("tier %q uses the badger index, which grows on demand", lt.t.Name).with(detail))
			continue
		case ix.Use != lmdbindex.Name:
			parts = append(parts, passf("tier %q uses index %q; only lmdb has a fixed map to check", lt.t.Name, ix.Use).with(detail))
			continue
		}
		c := lmdbindex.DefaultConfig()
		if p, ok := ix.Config.(*lmdbindex.Config); ok && p != nil {
			c = *p
		}
		var entries int64
		var err error
		for d := range lt.c.Disks {
			var slots int64
			var ranks int
			if _, slots, ranks, err = diskNeed(e.st, lt.c, d); err != nil {
				break
			}
			entries += slots * int64(ranks) * int64(len(e.st.Payload.Kinds))
		}
		if err != nil {
			parts = append(parts, failf("tier %q: %v", lt.t.Name, err).with(detail))
			continue
		}
		// NB: puts leave the last part of the map to deletes (see
		// indexes/lmdb's reserve), so the entries must fit the rest.
		reserve := lmdbindex.ReserveBytes(c.MapSizeBytes)
		need := entries*lmdbEntryBytes + reserve
		detail["entries"], detail["need_bytes"], detail["map_size_bytes"] = entries, need, c.MapSizeBytes
		detail["entry_bytes"], detail["reserve_bytes"] = lmdbEntryBytes, reserve
		what := fmt.Sprintf("tier %q: the lmdb map of %s holds about %d entries beside its %s delete reserve; the slots can produce %d (%s at %d B each, keys %d B + records %d B + B-tree)",
			lt.t.Name, human(c.MapSizeBytes), max(0, c.MapSizeBytes-reserve)/lmdbEntryBytes, human(reserve), entries, human(entries*lmdbEntryBytes), lmdbEntryBytes, indexes.KeySize, indexes.RecordSize)
		want := int64(float64(entries*lmdbEntryBytes)*lmdbHeadroom) + reserve
		switch {
		case c.MapSizeBytes < need:
			parts = append(parts, failf("%s: once the index fills, the store evicts to fit it and the rest of the disk budget is never used; set index.config.map_size_bytes to at least %d", what, want).with(detail))
		case c.MapSizeBytes < want:
			parts = append(parts, warnf("%s: less than %.0f%% headroom for B-tree slack; set index.config.map_size_bytes to %d", what, 100*(lmdbHeadroom-1), want).with(detail))
		default:
			parts = append(parts, passf("%s", what).with(detail))
		}
	}
	return merge("indexes", parts)
}
