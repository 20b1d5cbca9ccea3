package consensus

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios runs the data-driven scenario files in testdata
// (cockroachdb/datadriven): each block is a command, a "----" line and its
// expected output. Run with -rewrite to regenerate the expectations, then
// review the diff.
//
// Commands:
//
//	shape classes=N ok=N reloads=N [digest=none|whole|structures]
//	contribute rank=R tick=T [counts=g/d/r/l,...] [ok=101] [prefix=4,8] [digest=HEX] [structs=HEX,HEX,HEX,HEX]
//	reduce tick=T          (reduces the contributions given since the last reduce, by rank)
//	roundtrip rank=R       (encodes and decodes rank R's pending contribution)
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files in testdata (err %v)", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			s := &scenario{cs: map[int]Contribution{}}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				out, err := s.exec(d.FullCmd())
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return out
			})
		})
	}
}

type scenario struct {
	shape Shape
	cs    map[int]Contribution
}

func (s *scenario) exec(line string) (string, error) {
	fields := strings.Fields(line)
	args := map[string]string{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return "", fmt.Errorf("argument %q: want key=value", f)
		}
		args[k] = v
	}
	num := func(k string) (int, error) {
		v, ok := args[k]
		if !ok {
			return 0, fmt.Errorf("missing %s=", k)
		}
		return strconv.Atoi(v)
	}
	switch fields[0] {
	case "shape":
		var sh Shape
		var err error
		if sh.Classes, err = num("classes"); err != nil {
			return "", err
		}
		if sh.OKBits, err = num("ok"); err != nil {
			return "", err
		}
		if sh.Reloads, err = num("reloads"); err != nil {
			return "", err
		}
		switch args["digest"] {
		case "", "none":
		case "whole":
			sh.Digest = true
		case "structures":
			sh.Digest, sh.Structures = true, int(NumStructures)
		default:
			return "", fmt.Errorf("digest=%s: want none, whole or structures", args["digest"])
		}
		if err := sh.Validate(); err != nil {
			return "", err
		}
		s.shape = sh
		return sh.String() + "\n", nil
	case "contribute":
		r, err := num("rank")
		if err != nil {
			return "", err
		}
		tk, err := num("tick")
		if err != nil {
			return "", err
		}
		c := NewContribution(uint64(tk), s.shape)
		if v := args["counts"]; v != "" {
			c.Counts = nil
			for _, k := range strings.Split(v, ",") {
				var n Counts
				if _, err := fmt.Sscanf(k, "%d/%d/%d/%d", &n.Gathered, &n.Durable, &n.Reloaded, &n.L1Copied); err != nil {
					return "", fmt.Errorf("counts %q: %w", k, err)
				}
				c.Counts = append(c.Counts, n)
			}
		}
		if v, ok := args["ok"]; ok {
			c.OK = nil
			for _, ch := range v {
				c.OK = append(c.OK, ch == '1')
			}
		}
		if v := args["prefix"]; v != "" {
			c.Prefix = nil
			for _, p := range strings.Split(v, ",") {
				n, err := strconv.ParseUint(p, 10, 32)
				if err != nil {
					return "", err
				}
				c.Prefix = append(c.Prefix, uint32(n))
			}
		}
		if v := args["digest"]; v != "" {
			if _, err := hex.Decode(c.Digest[:], []byte(v)); err != nil {
				return "", err
			}
		}
		if v := args["structs"]; v != "" {
			for i, h := range strings.Split(v, ",") {
				if i >= len(c.Structures) {
					return "", fmt.Errorf("structs: %d digests for shape %s", i+1, s.shape)
				}
				if _, err := hex.Decode(c.Structures[i][:], []byte(h)); err != nil {
					return "", err
				}
			}
		}
		s.cs[r] = c
		return fmt.Sprintf("rank %d: %s\n", r, c), nil
	case "reduce":
		tk, err := num("tick")
		if err != nil {
			return "", err
		}
		cs := make([]Contribution, len(s.cs))
		for r, c := range s.cs {
			if r < 0 || r >= len(cs) {
				return "", fmt.Errorf("ranks are not 0..%d", len(cs)-1)
			}
			cs[r] = c
		}
		s.cs = map[int]Contribution{}
		f, err := Reduce(uint64(tk), cs)
		if err != nil {
			return "", err
		}
		return "frontier: " + f.String() + "\n", nil
	case "roundtrip":
		r, err := num("rank")
		if err != nil {
			return "", err
		}
		env := Envelope{Group: 1, Stack: 2, Rank: r, Size: len(s.cs)}
		b, err := AppendContribution(nil, env, s.cs[r])
		if err != nil {
			return "", err
		}
		_, c, err := DecodeContribution(b, Expect{Group: 1, Stack: 2, Size: len(s.cs)})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d bytes: %s\n", len(b), c), nil
	}
	return "", fmt.Errorf("unknown command %q", fields[0])
}
