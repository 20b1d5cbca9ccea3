package workload

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

// smallConfig is a fast config for the property tests.
func smallConfig(seed uint64) GeneratorConfig {
	c := DefaultGeneratorConfig()
	c.Seed = seed
	c.Requests = 3000
	c.ActiveConversations = 64
	return c
}

func TestGenerateDeterministic(t *testing.T) {
	a, err := Generate(smallConfig(7))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate(smallConfig(7))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed gave different workloads")
	}
	c, err := Generate(smallConfig(8))
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("different seeds gave the same workload")
	}
}

// TestGenerateFormat checks that generated traces obey every rule the
// reader enforces and survive a Write/read round trip.
func TestGenerateFormat(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		reqs, err := Generate(smallConfig(seed))
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != 3000 {
			t.Fatalf("seed %d: %d requests, want 3000", seed, len(reqs))
		}
		var buf bytes.Buffer
		if err := Write(&buf, reqs); err != nil {
			t.Fatalf("seed %d: Write: %v", seed, err)
		}
		back, err := NewReader(&buf, "gen").ReadAll()
		if err != nil {
			t.Fatalf("seed %d: reading the generated trace: %v", seed, err)
		}
		if !reflect.DeepEqual(back, reqs) {
			t.Fatalf("seed %d: round trip changed the trace", seed)
		}
	}
}

// TestGeneratePrefixChains checks that ids are prefix-chained: an id is
// always at the same position after the same parent, and ids are numbered
// from 0 in order of first appearance, like the published trace.
func TestGeneratePrefixChains(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		reqs, err := Generate(smallConfig(seed))
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckChains(reqs); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		next := uint64(0)
		for i, r := range reqs {
			for _, id := range r.HashIDs {
				if id > next {
					t.Fatalf("seed %d: request %d: id %d appears before id %d", seed, i, id, next)
				}
				if id == next {
					next++
				}
			}
		}
	}
}

func TestCheckChainsRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		reqs []Request
	}{
		{"same id, different parent", []Request{{HashIDs: []uint64{1, 2}}, {HashIDs: []uint64{3, 2}}}},
		{"same id, different position", []Request{{HashIDs: []uint64{1, 2}}, {HashIDs: []uint64{2}}}},
		{"first id later has a parent", []Request{{HashIDs: []uint64{5}}, {HashIDs: []uint64{4, 5}}}},
	} {
		if err := CheckChains(tc.reqs); err == nil || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", tc.name, err)
		}
	}
	if err := CheckChains([]Request{{HashIDs: []uint64{1, 2}}, {HashIDs: []uint64{1, 2, 3}}, {HashIDs: []uint64{1, 4}}}); err != nil {
		t.Errorf("a valid chain set: %v", err)
	}
}

// TestGenerateMultiTurn checks that each turn extends the previous turn of
// its conversation plus its output: the previous turn's full blocks are a
// prefix of the next turn's ids, and the next input holds at least the
// previous input and output.
func TestGenerateMultiTurn(t *testing.T) {
	cfg := smallConfig(11)
	reqs, metas, err := generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]int{} // conversation → index of its last turn
	checked := 0
	for i, m := range metas {
		if m.kind != kindChat {
			continue
		}
		j, ok := last[m.conv]
		last[m.conv] = i
		if !ok {
			if m.turn != 0 {
				t.Fatalf("request %d: conversation %d starts at turn %d", i, m.conv, m.turn)
			}
			continue
		}
		prev, cur := reqs[j], reqs[i]
		if metas[j].turn+1 != m.turn {
			t.Fatalf("request %d: turn %d follows turn %d", i, m.turn, metas[j].turn)
		}
		if cur.InputLength < prev.InputLength+prev.OutputLength+cfg.UserTokens.Min {
			t.Fatalf("request %d: input %d does not extend previous input %d + output %d + a message", i, cur.InputLength, prev.InputLength, prev.OutputLength)
		}
		full := prev.InputLength / BlockTokens
		if !reflect.DeepEqual(cur.HashIDs[:full], prev.HashIDs[:full]) {
			t.Fatalf("request %d: the previous turn's %d full blocks are not a prefix", i, full)
		}
		if prev.InputLength%BlockTokens != 0 && cur.HashIDs[full] == prev.HashIDs[full] {
			t.Fatalf("request %d: the previous turn's partial last block kept its id after being filled", i)
		}
		checked++
	}
	if checked < 500 {
		t.Fatalf("only %d continuation turns checked; the workload has too few multi-turn conversations", checked)
	}
}

// TestGenerateStatistics checks that the workload roughly matches its
// config: the request mix, the mean turns per conversation, the shared
// system prompts, the Zipf skew, and the arrival rate.
func TestGenerateStatistics(t *testing.T) {
	cfg := DefaultGeneratorConfig()
	cfg.Seed = 3
	reqs, metas, err := generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	count := map[kind]int{}
	turns := map[int]int{}
	firstIDs := map[uint64]bool{}
	promptUse := make([]int, cfg.SystemPrompts)
	for i, m := range metas {
		count[m.kind]++
		if m.kind == kindChat {
			turns[m.conv]++
			firstIDs[reqs[i].HashIDs[0]] = true
			promptUse[m.prompt]++
		}
	}
	n := float64(len(reqs))
	sum := cfg.Mix.Chat + cfg.Mix.Document + cfg.Mix.Scan
	for _, k := range []struct {
		kind kind
		want float64
		name string
	}{{kindChat, cfg.Mix.Chat / sum, "chat"}, {kindDocument, cfg.Mix.Document / sum, "document"}, {kindScan, cfg.Mix.Scan / sum, "scan"}} {
		if got := float64(count[k.kind]) / n; math.Abs(got-k.want) > 0.03 {
			t.Errorf("%s share %.3f, want %.3f ± 0.03", k.name, got, k.want)
		}
	}
	// Conversations still open at the end are cut short; count those that
	// started in the first half only.
	var total, convs float64
	for id, n := range turns {
		if id <= len(turns)/2 {
			total += float64(n)
			convs++
		}
	}
	// Conversations that hit MaxInputTokens end early, so the mean may
	// fall a little below MeanTurns.
	if mean := total / convs; mean < cfg.MeanTurns*0.75 || mean > cfg.MeanTurns*1.1 {
		t.Errorf("mean turns %.2f, want about %.1f", mean, cfg.MeanTurns)
	}
	// The first block of a chat request is the system prompt's (prompts
	// are at least one block long), so there are at most SystemPrompts
	// distinct first ids.
	if len(firstIDs) > cfg.SystemPrompts {
		t.Errorf("%d distinct first blocks among chat requests, want at most %d shared system prompts", len(firstIDs), cfg.SystemPrompts)
	}
	// Zipf: the most popular prompt serves more chat turns than the ten
	// least popular together.
	tail := 0
	for _, u := range promptUse[cfg.SystemPrompts-10:] {
		tail += u
	}
	if promptUse[0] <= tail {
		t.Errorf("prompt popularity is not skewed: top %d, bottom ten %d", promptUse[0], tail)
	}
	// Arrival rate within 5%.
	span := float64(reqs[len(reqs)-1].Timestamp-reqs[0].Timestamp) / 1000
	if rate := n / span; math.Abs(rate-cfg.RatePerSecond)/cfg.RatePerSecond > 0.05 {
		t.Errorf("arrival rate %.2f/s, want %.1f/s", rate, cfg.RatePerSecond)
	}
}

// TestGenerateReuse checks the property that makes the default workload a
// useful replay: a large share of blocks are reused (shared prompts and
// conversation history), but far from all (documents and scans).
func TestGenerateReuse(t *testing.T) {
	reqs, err := Generate(DefaultGeneratorConfig())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	var blocks, reused int
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			blocks++
			if seen[id] {
				reused++
			}
			seen[id] = true
		}
	}
	share := float64(reused) / float64(blocks)
	t.Logf("%d requests, %d blocks, %d distinct, %.1f%% reused (the infinite-cache block hit rate)", len(reqs), blocks, len(seen), 100*share)
	if share < 0.3 || share > 0.85 {
		t.Errorf("block reuse %.1f%%, want between 30%% and 85%%", 100*share)
	}
}

func TestGeneratorConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		field  string
		mutate func(*GeneratorConfig)
	}{
		{"Requests", func(c *GeneratorConfig) { c.Requests = -1 }},
		{"Requests", func(c *GeneratorConfig) { c.Requests = MaxGeneratedRequests + 1 }},
		{"Requests", func(c *GeneratorConfig) { c.Requests = 99_999_999_999 }},
		{"ActiveConversations", func(c *GeneratorConfig) { c.ActiveConversations = maxGeneratorActive + 1 }},
		{"SystemPrompts", func(c *GeneratorConfig) { c.SystemPrompts = 1 << 40 }},
		{"ActiveDocuments", func(c *GeneratorConfig) { c.ActiveDocuments = maxGeneratorActive + 1 }},
		{"ActiveAgents", func(c *GeneratorConfig) { c.Mix.Agent, c.ActiveAgents = 1, maxGeneratorActive+1 }},
		{"RatePerSecond", func(c *GeneratorConfig) { c.RatePerSecond = 0 }},
		{"RatePerSecond", func(c *GeneratorConfig) { c.RatePerSecond = math.NaN() }},
		{"Mix", func(c *GeneratorConfig) { c.Mix = Mix{} }},
		{"Mix", func(c *GeneratorConfig) { c.Mix.Scan = -1 }},
		{"SystemPrompts", func(c *GeneratorConfig) { c.SystemPrompts = 0 }},
		{"SystemPromptZipf", func(c *GeneratorConfig) { c.SystemPromptZipf = 1 }},
		{"ActiveConversations", func(c *GeneratorConfig) { c.ActiveConversations = 0 }},
		{"MeanTurns", func(c *GeneratorConfig) { c.MeanTurns = 0.5 }},
		{"DocumentPromptShare", func(c *GeneratorConfig) { c.DocumentPromptShare = 2 }},
		{"ScanBurst", func(c *GeneratorConfig) { c.ScanBurst = 0 }},
		{"UserTokens", func(c *GeneratorConfig) { c.UserTokens = Range{Min: 10, Max: 5} }},
		{"ScanTokens", func(c *GeneratorConfig) { c.ScanTokens.Min = 0 }},
		{"MaxInputTokens", func(c *GeneratorConfig) { c.MaxInputTokens = 100 }},
	} {
		c := DefaultGeneratorConfig()
		tc.mutate(&c)
		_, err := Generate(c)
		if err == nil || !errors.Is(err, ErrBadGeneratorConfig) || !bytes.Contains([]byte(err.Error()), []byte(tc.field+":")) {
			t.Errorf("%s: got %v, want an ErrBadGeneratorConfig naming the field", tc.field, err)
		}
	}
	if reqs, err := Generate(GeneratorConfig{Requests: 0, RatePerSecond: 1, Mix: Mix{Scan: 1}, SystemPrompts: 1, SystemPromptZipf: 2,
		SystemPromptTokens: Range{1, 1}, ActiveConversations: 1, MeanTurns: 1, UserTokens: Range{1, 1}, OutputTokens: Range{1, 1},
		MaxInputTokens: 2, DocumentTokens: Range{1, 1}, ScanBurst: 1, ScanTokens: Range{1, 1}}); err != nil || len(reqs) != 0 {
		t.Errorf("zero requests: %d, %v", len(reqs), err)
	}
}

func BenchmarkGenerateDefault(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Generate(DefaultGeneratorConfig()); err != nil {
			b.Fatal(err)
		}
	}
}
