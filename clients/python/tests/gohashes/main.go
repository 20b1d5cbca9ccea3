// Command gohashes prints page hashes computed by kvtier's Go pagehash
// package, for the Python client's cross-check
// (clients/python/tests/test_pagehash.py runs it with `go run`).
//
// Each input line is "PAGE_TOKENS PREV_HEX TOKEN..." (tokens in decimal);
// each output line holds the hex hashes of that line's whole pages,
// space-separated, or "-" when it has none. A malformed line is an error
// naming its number, exit status 1.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/pagehash"
)

// maxLine bounds one input line (tokens of one sequence).
const maxLine = 64 << 20

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gohashes:", err)
		os.Exit(1)
	}
}

func run(r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), maxLine)
	out := bufio.NewWriter(w)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			return fmt.Errorf("line %d: want PAGE_TOKENS PREV_HEX TOKEN..., got %d fields", n, len(f))
		}
		p, err := strconv.Atoi(f[0])
		if err != nil || p <= 0 {
			return fmt.Errorf("line %d: page_tokens %q: want a positive integer", n, f[0])
		}
		prev, err := pagehash.Parse(f[1])
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		tokens := make([]uint32, len(f)-2)
		for i, s := range f[2:] {
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return fmt.Errorf("line %d: token %d: %w", n, i, err)
			}
			tokens[i] = uint32(v)
		}
		hs := pagehash.Chain(nil, prev, tokens, p)
		if len(hs) == 0 {
			fmt.Fprintln(out, "-")
			continue
		}
		for i, h := range hs {
			if i > 0 {
				out.WriteByte(' ')
			}
			out.WriteString(h.String())
		}
		out.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return out.Flush()
}
