package main

// A README that cannot lie (issue 30): every kvtier command the README
// shows is run through run(), in-process, so a flag that was renamed, a
// subcommand that went away or a synopsis whose flags exclude each other
// fails here, naming the README line.
//
// What is extracted, in README order:
//   - every inline code span that starts with "kvtier " or "bin/kvtier "
//     (tables and prose). Such a span is a synopsis: [x] is optional (the
//     test includes it), "a|b" (written \| in a table) offers alternatives
//     (the test runs each), and upper-case words are placeholders (TRACE,
//     FILE, N, ...) replaced by real values (readmePlaceholders,
//     readmeFlagValues). In a table headed "command", every code span of
//     the first column must be a whole kvtier command: an abbreviation
//     (`l2` after `kvtier bench radix`) is an error, since it cannot be
//     checked. `bin/kvtier` and `bin/kvtier ...` alone name the binary and
//     are skipped.
//   - every line of a fenced code block that starts with "kvtier " or
//     "bin/kvtier " (after an optional "$ "), lines ending in \ joined. These
//     are shell lines a user pastes: words are split as the shell does,
//     "# ..." is a comment, "> FILE" sends stdout to FILE, and the lines
//     of one block run in one temporary directory, in order (so
//     `kvtier config default > stack.yaml` feeds the next line's
//     stack.yaml). No synopsis notation is read there.
//
// How each command runs is readmeModes below: for real where it is cheap
// and needs nothing outside the test, else with --help appended, where it
// must still parse: run must return flag.ErrHelp, not an unknown flag or
// command. Every command runs in its own temporary working directory (a
// fenced block's lines share one), so relative outputs (stack.yaml,
// replay --sweep's plots/) never land in the source tree.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readmeMode says how the test runs a README command.
type readmeMode int

const (
	// readmeHelp appends --help: the command must parse (flag.ErrHelp).
	readmeHelp readmeMode = iota
	// readmeReal runs the command for real: it must succeed.
	readmeReal
)

// readmeModes maps a command ("bench", or "plugin sum" where the two
// words differ from the first alone) to how the test runs it and why.
// A command not listed runs with --help.
var readmeModes = map[string]struct {
	mode readmeMode
	why  string
}{
	"help":       {readmeReal, "lists the commands"},
	"version":    {readmeReal, "prints the version"},
	"config":     {readmeReal, "validates or prints a stack config (FILE: the embedded default, written to a temp file)"},
	"generate":   {readmeReal, "writes a seeded trace, 0.1-0.2 s; -o FILE goes into the temp dir"},
	"replay":     {readmeReal, "metadata replay, or --data through the built-in stack under a temp dir, of a generated 300-request trace (the README's trace path is replaced by it when absent); a --sweep plot goes into the temp dir"},
	"plugin sum": {readmeReal, "SHA-256 of a file (PATH: the test binary)"},
	"serve":      {readmeHelp, "runs until stopped"},
	"loadgen":    {readmeHelp, "needs a running serve"},
	"doctor":     {readmeHelp, "probes hugepages, disks and fdatasync latency of this machine, and fails where hugepages are missing"},
	"bench":      {readmeHelp, "measures for seconds to minutes"},
	"sim":        {readmeHelp, "100000 ticks by default, and the README's --inject-divergence makes it fail on purpose"},
	"ab":         {readmeHelp, "scrapes a running serve for a window (--metrics) or needs saved scrapes (--from)"},
	"inspect":    {readmeHelp, "needs an L3 on disk"},
	"plugin":     {readmeHelp, "needs a plugin binary"},
}

// readmePlaceholders maps a placeholder word of the README to the value
// the test substitutes. A value in angle brackets names one of the test's
// files (readmeEnv.value). An upper-case word not listed fails the test.
var readmePlaceholders = map[string]string{
	"TRACE":   "<trace>",
	"FILE":    "<file>", // by flag or command: readmeEnv.file
	"PATH":    "<path>", // by command: readmeEnv.path
	"DIR":     "<dir>",
	"N":       "4",
	"M":       "2", // kvtier sim --nodes: divides N
	"T":       "100",
	"S":       "1",
	"P":       "lru",
	"P2,P3":   "slru,s3fifo",
	"SPEC":    "stall:1@50",
	"TICK":    "50",
	"ADDR":    "127.0.0.1:9400",
	"URL":     "http://127.0.0.1:9400/metrics",
	"H:P,...": "127.0.0.1:6379",
	"HEX":     "0000000000000000000000000000000000000000000000000000000000000000",
	"JSON":    "{}",
}

// readmeFlagValues overrides readmePlaceholders for the value of a flag
// when the placeholder stands for a path (FILE, PATH, DIR, TRACE).
var readmeFlagValues = map[string]string{
	"config":       "<config>",
	"store-config": "<config>",
	"data-dir":     "<dir>",
	"dir":          "<dir>",
	"socket":       "<socket>",
	"o":            "<out>",
	"record":       "<out>",
	"save":         "<out>",
	"from":         "<out>",
}

// placeholderRE matches a word that looks like a placeholder: upper-case
// words, comma-separated.
var placeholderRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]*(,[A-Z][A-Z0-9_]*)*$`)

// subtestWordRE matches the words of a command that name its subtest.
var subtestWordRE = regexp.MustCompile(`^(--)?[a-z][a-z0-9-]*$`)

// readmeCommand is one kvtier command found in the README.
type readmeCommand struct {
	// Line is the README line (1-based) it starts on; Text as written.
	Line int
	Text string
	// Block is the fenced block's number (from 1), 0 for an inline span.
	Block int
	// Args are the words after kvtier; Stdout the file of a "> FILE".
	Args   []string
	Stdout string
}

// readmeProblem is a README line the test cannot accept.
type readmeProblem struct {
	Line int
	Msg  string
}

func (p readmeProblem) Error() string { return fmt.Sprintf("README.md:%d: %s", p.Line, p.Msg) }

// kvtierPrefix returns the text after a leading "kvtier " or "bin/kvtier "
// (or "./bin/kvtier "), and whether there was one.
func kvtierPrefix(s string) (string, bool) {
	for _, p := range []string{"kvtier ", "bin/kvtier ", "./bin/kvtier "} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			return rest, true
		}
	}
	if s == "kvtier" || s == "bin/kvtier" || s == "./bin/kvtier" {
		return "", true
	}
	return "", false
}

// extractReadme returns the README's kvtier commands in order, each
// synopsis expanded into its variants, and the problems found.
func extractReadme(text string) ([]readmeCommand, []error) {
	var cmds []readmeCommand
	var problems []error
	lines := strings.Split(text, "\n")
	block, inFence, fence := 0, false, ""
	commandTable := false
	for i := 0; i < len(lines); i++ {
		line, lineNo := lines[i], i+1
		trimmed := strings.TrimSpace(line)
		if inFence {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				inFence = false
				continue
			}
			// Join continuation lines.
			joined := trimmed
			for strings.HasSuffix(joined, `\`) && i+1 < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i+1]), fence) {
				i++
				joined = strings.TrimSuffix(joined, `\`) + " " + strings.TrimSpace(lines[i])
			}
			joined = strings.TrimPrefix(joined, "$ ")
			if _, ok := kvtierPrefix(joined); !ok {
				continue
			}
			found, err := shellCommands(joined)
			if err != nil {
				problems = append(problems, readmeProblem{lineNo, err.Error()})
				continue
			}
			for _, c := range found {
				c.Line, c.Text, c.Block = lineNo, joined, block
				cmds = append(cmds, c)
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			n := len(trimmed) - len(strings.TrimLeft(trimmed, trimmed[:1]))
			inFence, fence = true, trimmed[:n]
			block++
			continue
		}
		isRow := strings.HasPrefix(trimmed, "|")
		if !isRow {
			commandTable = false
		}
		var cells []string
		if isRow {
			cells = tableCells(trimmed)
			if len(cells) > 0 && strings.TrimSpace(cells[0]) == "command" {
				commandTable = true
			}
		} else {
			cells = []string{line}
		}
		for ci, cell := range cells {
			for _, span := range codeSpans(cell) {
				if isRow {
					span = strings.ReplaceAll(span, `\|`, "|")
				}
				rest, ok := kvtierPrefix(span)
				if ok && (rest == "" || rest == "...") {
					// NB: `bin/kvtier` and `bin/kvtier ...` name the binary,
					// they are not commands.
					continue
				}
				if !ok {
					if commandTable && ci == 0 {
						problems = append(problems, readmeProblem{lineNo, fmt.Sprintf("`%s` in the command column is not a whole command: write it as `kvtier ...` so it can be checked", span)})
					}
					continue
				}
				variants, err := expandSynopsis(rest)
				if err != nil {
					problems = append(problems, readmeProblem{lineNo, fmt.Sprintf("`%s`: %v", span, err)})
					continue
				}
				for _, v := range variants {
					cmds = append(cmds, readmeCommand{Line: lineNo, Text: span, Args: v})
				}
			}
		}
	}
	if inFence {
		problems = append(problems, readmeProblem{len(lines), "a fenced code block is not closed"})
	}
	return cmds, problems
}

// tableCells splits a table row into its cells at pipes not escaped with
// a backslash (as GitHub does, inside code spans too).
func tableCells(row string) []string {
	row = strings.TrimPrefix(strings.TrimSpace(row), "|")
	var cells []string
	var b strings.Builder
	for i := 0; i < len(row); i++ {
		switch {
		case row[i] == '\\' && i+1 < len(row) && row[i+1] == '|':
			b.WriteString(`\|`)
			i++
		case row[i] == '|':
			cells = append(cells, b.String())
			b.Reset()
		default:
			b.WriteByte(row[i])
		}
	}
	if s := strings.TrimSpace(b.String()); s != "" {
		cells = append(cells, b.String())
	}
	return cells
}

// codeSpans returns the inline code spans of s: text between equal runs
// of backticks, trimmed of the one space CommonMark strips.
func codeSpans(s string) []string {
	var spans []string
	for i := 0; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(s) && s[j] == '`' {
			j++
		}
		run := s[i:j]
		end := -1
		for k := j; k < len(s); {
			if s[k] != '`' {
				k++
				continue
			}
			m := k
			for m < len(s) && s[m] == '`' {
				m++
			}
			if m-k == len(run) {
				end = k
				break
			}
			k = m
		}
		if end < 0 {
			i = j
			continue
		}
		spans = append(spans, strings.TrimSpace(s[j:end]))
		i = end + len(run)
	}
	return spans
}

// maxReadmeVariants bounds the commands one synopsis expands into.
const maxReadmeVariants = 16

// expandSynopsis reads a synopsis ("replay [TRACE] --policy P [--a | --b]
// --group x|y") into the commands it describes: every optional part
// included, one command per alternative.
func expandSynopsis(s string) ([][]string, error) {
	var toks []string
	for _, w := range strings.Fields(s) {
		for strings.HasPrefix(w, "[") {
			toks = append(toks, "[")
			w = w[1:]
		}
		var closing int
		for strings.HasSuffix(w, "]") {
			closing++
			w = w[:len(w)-1]
		}
		if w != "" {
			toks = append(toks, w)
		}
		for range closing {
			toks = append(toks, "]")
		}
	}
	variants, next, err := synopsisAlt(toks, 0)
	if err != nil {
		return nil, err
	}
	if next != len(toks) {
		return nil, fmt.Errorf("unbalanced ] at word %d", next+1)
	}
	return variants, nil
}

// synopsisAlt reads seq ("|" seq)* from toks[i:].
func synopsisAlt(toks []string, i int) ([][]string, int, error) {
	out, i, err := synopsisSeq(toks, i)
	if err != nil {
		return nil, i, err
	}
	for i < len(toks) && toks[i] == "|" {
		var more [][]string
		more, i, err = synopsisSeq(toks, i+1)
		if err != nil {
			return nil, i, err
		}
		out = append(out, more...)
	}
	if len(out) > maxReadmeVariants {
		return nil, i, fmt.Errorf("expands into more than %d commands", maxReadmeVariants)
	}
	return out, i, nil
}

// synopsisSeq reads a sequence of words and [alt] groups from toks[i:].
func synopsisSeq(toks []string, i int) ([][]string, int, error) {
	out := [][]string{{}}
	for i < len(toks) && toks[i] != "]" && toks[i] != "|" {
		var alts [][]string
		if toks[i] == "[" {
			var err error
			alts, i, err = synopsisAlt(toks, i+1)
			if err != nil {
				return nil, i, err
			}
			if i >= len(toks) || toks[i] != "]" {
				return nil, i, errors.New("unclosed [")
			}
			i++
		} else {
			for _, w := range strings.Split(toks[i], "|") {
				if w == "" {
					return nil, i, fmt.Errorf("empty alternative in %q", toks[i])
				}
				alts = append(alts, []string{w})
			}
			i++
		}
		var next [][]string
		for _, o := range out {
			for _, a := range alts {
				next = append(next, append(append([]string(nil), o...), a...))
			}
		}
		if len(next) > maxReadmeVariants {
			return nil, i, fmt.Errorf("expands into more than %d commands", maxReadmeVariants)
		}
		out = next
	}
	return out, i, nil
}

// shellCommands splits a shell line as sh would (quotes, backslashes, a
// "#" comment) into its kvtier commands: segments between ;, &&, || and
// |, the ones that start with kvtier; "> FILE" sets Stdout.
func shellCommands(line string) ([]readmeCommand, error) {
	type word struct {
		s  string
		op bool
	}
	var words []word
	var b strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, word{s: b.String()})
			b.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			i = len(line)
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unclosed ' quote")
			}
			b.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
				b.WriteByte(line[j])
			}
			if j >= len(line) {
				return nil, errors.New("unclosed \" quote")
			}
			inWord = true
			i = j
		case c == '\\' && i+1 < len(line):
			b.WriteByte(line[i+1])
			inWord = true
			i++
		case strings.ContainsRune(";&|><", rune(c)):
			flush()
			op := string(c)
			if i+1 < len(line) && (line[i+1] == c) {
				op += string(c)
				i++
			}
			words = append(words, word{s: op, op: true})
		case c == '$' || c == '`' || c == '*' || c == '?':
			return nil, fmt.Errorf("shell expansion (%c) is not supported in a checked command; write the value out", c)
		default:
			b.WriteByte(c)
			inWord = true
		}
	}
	flush()
	var out []readmeCommand
	var cur *readmeCommand
	started := false
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !w.op {
			if !started {
				started = true
				if _, ok := kvtierPrefix(w.s + " "); ok {
					out = append(out, readmeCommand{})
					cur = &out[len(out)-1]
				}
				continue
			}
			if cur != nil {
				cur.Args = append(cur.Args, w.s)
			}
			continue
		}
		switch w.s {
		case ">":
			if i+1 >= len(words) || words[i+1].op {
				return nil, errors.New("> without a file")
			}
			if cur != nil {
				cur.Stdout = words[i+1].s
			}
			i++
		case ">>", "<":
			return nil, fmt.Errorf("%s is not supported in a checked command", w.s)
		default: // ; && || |
			cur, started = nil, false
		}
	}
	return out, nil
}

// readmeEnv holds the files a command's placeholders stand for.
type readmeEnv struct {
	trace, config, self string
	dir                 string // the command's working directory
	outs                int
}

// value returns what a substitution names: a file of the env or itself.
func (e *readmeEnv) value(v, command, flagName string) string {
	switch v {
	case "<trace>":
		return e.trace
	case "<config>":
		return e.config
	case "<dir>":
		return e.dir
	case "<socket>":
		return filepath.Join(e.dir, "kvtier.sock")
	case "<out>":
		e.outs++
		return filepath.Join(e.dir, fmt.Sprintf("out%d", e.outs))
	case "<file>", "<path>":
		switch {
		case command == "config":
			return e.config
		case command == "plugin":
			return e.self
		case command == "replay" || command == "loadgen":
			return e.trace
		}
		return e.value("<out>", command, flagName)
	}
	return v
}

// concretize returns args with placeholders replaced, and for commands
// run for real, paths outside the working directory moved into it: an
// absent trace of replay or loadgen becomes the generated one, and
// generate's -o goes into the working directory.
func (e *readmeEnv) concretize(args []string, mode readmeMode) ([]string, error) {
	command := ""
	if len(args) > 0 {
		command = args[0]
	}
	out := make([]string, 0, len(args))
	prevFlag := ""
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			prevFlag = name
			if hasVal {
				v, err := e.substitute(val, command, name, mode)
				if err != nil {
					return nil, err
				}
				a = a[:len(a)-len(val)] + v
				prevFlag = ""
			}
			out = append(out, a)
			continue
		}
		v, err := e.substitute(a, command, prevFlag, mode)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		prevFlag = ""
	}
	return out, nil
}

// substitute returns the value for word w, the value of flag flagName
// ("" for a positional word) of command.
func (e *readmeEnv) substitute(w, command, flagName string, mode readmeMode) (string, error) {
	if v, ok := readmePlaceholders[w]; ok {
		isPath := v == "<file>" || v == "<path>" || v == "<dir>" || v == "<trace>"
		if fv, ok := readmeFlagValues[flagName]; ok && isPath {
			v = fv
		}
		return e.value(v, command, flagName), nil
	}
	if placeholderRE.MatchString(w) {
		return "", fmt.Errorf("unknown placeholder %q: name a value for it in readmePlaceholders", w)
	}
	if mode != readmeReal {
		return w, nil
	}
	switch {
	case (command == "replay" || command == "loadgen") && strings.HasSuffix(w, ".jsonl"):
		if _, err := os.Stat(w); err != nil {
			return e.trace, nil
		}
	case command == "generate" && flagName == "o" && w != "-" && filepath.IsAbs(w):
		return filepath.Join(e.dir, filepath.Base(w)), nil
	}
	return w, nil
}

// modeOf returns how the test runs args.
func modeOf(args []string) (readmeMode, string) {
	if len(args) >= 2 {
		if m, ok := readmeModes[args[0]+" "+args[1]]; ok {
			return m.mode, m.why
		}
	}
	if len(args) >= 1 {
		if m, ok := readmeModes[args[0]]; ok {
			return m.mode, m.why
		}
	}
	return readmeHelp, "not in readmeModes"
}

// minReadmeCommands guards the extraction: the README shows at least this
// many kvtier commands, so finding fewer means the extraction broke.
const minReadmeCommands = 20

func TestReadmeCommands(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	readmePath := filepath.Join(wd, "..", "..", "README.md")
	text, err := os.ReadFile(readmePath)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("no README at %s: nothing to check", readmePath)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmds, problems := extractReadme(string(text))
	for _, p := range problems {
		t.Error(p)
	}
	if len(cmds) < minReadmeCommands {
		t.Fatalf("found %d kvtier commands in README.md, want at least %d: did the extraction break?", len(cmds), minReadmeCommands)
	}

	// The files placeholders stand for, made by the CLI itself.
	shared := t.TempDir()
	ctx := context.Background()
	trace := filepath.Join(shared, "trace.jsonl")
	if err := run(ctx, []string{"generate", "--requests", "300", "--seed", "1", "-o", trace}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatalf("generate the trace the README's TRACE stands for: %v", err)
	}
	var cfg bytes.Buffer
	if err := run(ctx, []string{"config", "default"}, &cfg, &bytes.Buffer{}); err != nil {
		t.Fatalf("config default: %v", err)
	}
	config := filepath.Join(shared, "stack.yaml")
	if err := os.WriteFile(config, cfg.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	blockDirs := map[int]string{}
	var nReal, nHelp int
	for i, c := range cmds {
		var words []string
		for _, a := range c.Args {
			if len(words) < 2 && subtestWordRE.MatchString(a) {
				words = append(words, a)
			}
		}
		name := fmt.Sprintf("line%d_%d_%s", c.Line, i, strings.Join(words, "_"))
		t.Run(name, func(t *testing.T) {
			where := fmt.Sprintf("README.md:%d: `%s`", c.Line, c.Text)
			dir := t.TempDir()
			if c.Block > 0 {
				if d, ok := blockDirs[c.Block]; ok {
					dir = d
				} else {
					// NB: a block's directory must outlive this subtest: the
					// block's next line reads what this one wrote.
					d, err := os.MkdirTemp(shared, "block")
					if err != nil {
						t.Fatal(err)
					}
					dir, blockDirs[c.Block] = d, d
				}
			}
			t.Chdir(dir)
			env := &readmeEnv{trace: trace, config: config, self: self, dir: dir}
			mode, why := modeOf(c.Args)
			args, err := env.concretize(c.Args, mode)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if mode == readmeHelp {
				args = append(args, "--help")
			}
			var stdout, stderr bytes.Buffer
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			start := time.Now()
			err = run(rctx, args, &stdout, &stderr)
			how := "for real"
			if mode == readmeHelp {
				how = "with --help"
			}
			t.Logf("%s\n\tran %s (%s) in %v: kvtier %s", where, how, why, time.Since(start).Round(time.Millisecond), strings.Join(args, " "))
			switch {
			case mode == readmeHelp && errors.Is(err, flag.ErrHelp):
				nHelp++
			case mode == readmeHelp:
				t.Errorf("%s does not parse: kvtier %s: want the usage (flag.ErrHelp), got %v\nstderr:\n%s", where, strings.Join(args, " "), err, tail(stderr.String(), 2000))
			case err != nil:
				t.Errorf("%s fails: kvtier %s: %v\nstderr:\n%s", where, strings.Join(args, " "), err, tail(stderr.String(), 2000))
			default:
				nReal++
				if c.Stdout != "" {
					if err := os.WriteFile(c.Stdout, stdout.Bytes(), 0o644); err != nil {
						t.Fatalf("%s: > %s: %v", where, c.Stdout, err)
					}
				}
			}
		})
	}
	t.Logf("%d README commands: %d ran for real, %d parsed with --help", len(cmds), nReal, nHelp)
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// TestReadmeExtraction pins the extraction on a small README.
func TestReadmeExtraction(t *testing.T) {
	const text = "# x\n" +
		"| command | what |\n" +
		"| --- | --- |\n" +
		"| `kvtier replay [TRACE] [--capacity 1M \\| --sweep] [--json]` | a `kvtier version` |\n" +
		"| `kvtier bench radix\\|l2 [--json]` | b |\n" +
		"| `kvtier config default` · `config show` | c |\n" +
		"\n" +
		"Prose with `kvtier.tier.v1`, `bin/kvtier`, `bin/kvtier ...` and `kvtier sim --ranks N`.\n" +
		"```sh\n" +
		"make build\n" +
		"$ bin/kvtier config default > stack.yaml   # edit, then\n" +
		"bin/kvtier replay a.jsonl \\\n" +
		"  --vs 'lru,slru' | head\n" +
		"```\n"
	cmds, problems := extractReadme(text)
	var got []string
	for _, c := range cmds {
		s := fmt.Sprintf("%d:%s", c.Line, strings.Join(c.Args, " "))
		if c.Stdout != "" {
			s += " >" + c.Stdout
		}
		got = append(got, s)
	}
	want := []string{
		"4:replay TRACE --capacity 1M --json",
		"4:replay TRACE --sweep --json",
		"4:version",
		"5:bench radix --json",
		"5:bench l2 --json",
		"6:config default",
		"8:sim --ranks N",
		"11:config default >stack.yaml",
		"12:replay a.jsonl --vs lru,slru",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(problems) != 1 || !strings.Contains(problems[0].Error(), "README.md:6: `config show`") {
		t.Errorf("problems = %v, want one about `config show` on line 6", problems)
	}
	for _, bad := range []string{"replay [TRACE", "replay TRACE]", "a||b"} {
		if _, err := expandSynopsis(bad); err == nil {
			t.Errorf("expandSynopsis(%q): no error", bad)
		}
	}
}
