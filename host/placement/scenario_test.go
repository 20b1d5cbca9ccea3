package placement

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvtier/kvtier/tiers"
)

// TestScenarios runs the data-driven scenario files in testdata
// (cockroachdb/datadriven): each block is a command, a "----" line and its
// expected output. Run with -rewrite to regenerate the expectations, then
// review the diff.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files in testdata (err %v)", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var s scenario
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				return s.run(d.FullCmd())
			})
		})
	}
}

type scenario struct {
	a *Allocator
}

func (s *scenario) run(line string) string {
	out, err := s.exec(line)
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	return out
}

func parseArgs(fields []string) (map[string]string, error) {
	args := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("argument %q: want key=value", f)
		}
		args[k] = v
	}
	return args, nil
}

func intArg(args map[string]string, key string) (int64, error) {
	v, ok := args[key]
	if !ok {
		return 0, fmt.Errorf("missing %s=", key)
	}
	return strconv.ParseInt(v, 10, 64)
}

func intList(s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	var out []int64
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func (s *scenario) kinds(args map[string]string) (Kinds, error) {
	v, ok := args["kinds"]
	if !ok {
		return s.a.AllKinds(), nil
	}
	ks, err := intList(v)
	if err != nil {
		return 0, err
	}
	var set Kinds
	for _, k := range ks {
		set |= 1 << k
	}
	return set, nil
}

func (s *scenario) exec(line string) (string, error) {
	fields := strings.Fields(line)
	cmd := fields[0]
	if cmd == "new" {
		// new NAME/PAGEBYTES=PAGES,PAGES ... : each region on its own slab.
		var l Layout
		slab := tiers.SlabID(0)
		for _, f := range fields[1:] {
			spec, regions, _ := strings.Cut(f, "=")
			name, pb, _ := strings.Cut(spec, "/")
			pageBytes, err := strconv.ParseInt(pb, 10, 64)
			if err != nil {
				return "", err
			}
			counts, err := intList(regions)
			if err != nil {
				return "", err
			}
			kl := KindLayout{Name: name, PageBytes: pageBytes}
			for _, c := range counts {
				kl.Regions = append(kl.Regions, Region{Slab: slab, Pages: c})
				slab++
			}
			l.Kinds = append(l.Kinds, kl)
		}
		a, err := New(l)
		if err != nil {
			return "", err
		}
		s.a = a
		return l.String() + "\n", nil
	}
	args, err := parseArgs(fields[1:])
	if err != nil {
		return "", err
	}
	if cmd == "plan" {
		sizes, err := intList(args["slabs"])
		if err != nil {
			return "", err
		}
		var slabs []tiers.SlabFile
		for i, sz := range sizes {
			slabs = append(slabs, tiers.SlabFile{ID: tiers.SlabID(i), Path: fmt.Sprintf("slab%d", i), Size: sz})
		}
		var g tiers.PayloadGeometry
		for _, spec := range strings.Split(args["kinds"], ",") {
			name, pb, _ := strings.Cut(spec, "/")
			n, err := strconv.ParseInt(pb, 10, 64)
			if err != nil {
				return "", err
			}
			g.Kinds = append(g.Kinds, tiers.PayloadSpec{Name: name, PageBytes: n})
		}
		align := int64(1)
		if v, ok := args["align"]; ok {
			if align, err = strconv.ParseInt(v, 10, 64); err != nil {
				return "", err
			}
		}
		l, err := PlanLayout(slabs, g, align)
		if err != nil {
			return "", err
		}
		if s.a, err = New(l); err != nil {
			return "", err
		}
		return l.String() + "\n", nil
	}
	if s.a == nil {
		return "", errors.New("no allocator: start with new or plan")
	}
	a := s.a
	id, _ := intArg(args, "id")
	switch cmd {
	case "reserve":
		pages, err := intArg(args, "pages")
		if err != nil {
			return "", err
		}
		kinds, err := s.kinds(args)
		if err != nil {
			return "", err
		}
		if err := a.Reserve(ObjectID(id), pages, kinds); err != nil {
			return "", err
		}
		return s.object(ObjectID(id)), nil
	case "release":
		if err := a.Release(ObjectID(id)); err != nil {
			return "", err
		}
		return s.free(), nil
	case "commit":
		if err := a.Commit(ObjectID(id)); err != nil {
			return "", err
		}
		return s.object(ObjectID(id)), nil
	case "split":
		at, err := intArg(args, "at")
		if err != nil {
			return "", err
		}
		prefix, err := intArg(args, "prefix")
		if err != nil {
			return "", err
		}
		if err := a.Split(ObjectID(id), at, ObjectID(prefix)); err != nil {
			return "", err
		}
		return s.object(ObjectID(prefix)) + s.object(ObjectID(id)), nil
	case "evict":
		pages, err := intArg(args, "pages")
		if err != nil {
			return "", err
		}
		kinds, err := s.kinds(args)
		if err != nil {
			return "", err
		}
		vs, err := intList(args["victims"])
		if err != nil {
			return "", err
		}
		victims := make([]ObjectID, len(vs))
		for i, v := range vs {
			victims[i] = ObjectID(v)
		}
		n, err := a.EvictToFit(ObjectID(id), pages, kinds, victims)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("evicted %v\n", victims[:n]) + s.object(ObjectID(id)), nil
	case "reset":
		a.Reset()
		return s.free(), nil
	case "state":
		var b strings.Builder
		b.WriteString(s.free())
		ids := make([]ObjectID, 0)
		for oid := range a.objects {
			ids = append(ids, oid)
		}
		sortIDs(ids)
		for _, oid := range ids {
			b.WriteString(s.object(oid))
		}
		return b.String(), nil
	case "digest":
		d := a.Digest()
		return hex.EncodeToString(d[:8]) + "\n", nil
	case "spans", "pagespans":
		k, err := intArg(args, "kind")
		if err != nil {
			return "", err
		}
		spans, err := a.Spans(ObjectID(id), tiers.PayloadKind(k), nil)
		if cmd == "pagespans" {
			spans, err = a.PageSpans(ObjectID(id), tiers.PayloadKind(k), nil)
		}
		if err != nil {
			return "", err
		}
		var parts []string
		for _, sp := range spans {
			parts = append(parts, fmt.Sprintf("s%d@%d+%d", sp.Slab, sp.Offset, sp.Length))
		}
		return strings.Join(parts, " ") + "\n", nil
	}
	return "", fmt.Errorf("unknown command %q", cmd)
}

func sortIDs(ids []ObjectID) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}

func (s *scenario) free() string {
	var b strings.Builder
	b.WriteString("free:")
	for k, f := range s.a.free {
		if k > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s", s.a.layout.Kinds[k].Name)
		f.walk(func(start, pages int64) bool {
			fmt.Fprintf(&b, " [%d+%d]", start, pages)
			return true
		})
	}
	return b.String() + "\n"
}

func (s *scenario) object(id ObjectID) string {
	info, err := s.a.Object(id)
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	var b strings.Builder
	state := "reserved"
	if info.Committed {
		state = "committed"
	}
	fmt.Fprintf(&b, "object %d: %d pages, %s:", id, info.Pages, state)
	kind := -1
	for _, r := range info.Ranges {
		if int(r.Kind) != kind {
			kind = int(r.Kind)
			if kind > 0 || b.Len() > 0 {
				b.WriteString(" " + s.a.layout.Kinds[kind].Name)
			}
		}
		fmt.Fprintf(&b, " [%d+%d]", r.Start, r.Pages)
	}
	return b.String() + "\n"
}
