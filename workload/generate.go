package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Range is an inclusive range of token counts, sampled log-uniformly (short
// messages are more common than long ones, but long ones carry most of the
// tokens, as in real chat and RAG traffic).
type Range struct {
	// Min and Max bound the count, 1 <= Min <= Max.
	Min, Max int
}

// Mix gives the relative weight of each kind of request. Weights need not
// sum to 1; each kind's share of the requests is its weight over the sum.
type Mix struct {
	// Chat is multi-turn conversations that start with a shared system
	// prompt; each turn's input is the previous turn's input, its output
	// and a new user message.
	Chat float64
	// Document is one-shot questions over a long document that is never
	// asked about again, half of them (DocumentPromptShare) behind a
	// shared system prompt.
	Document float64
	// Scan is bursts of back-to-back requests with unique prompts and no
	// shared prefix (batch jobs, evaluation sweeps): pure cache pollution.
	Scan float64
	// Agent is steps of agent loops (GeneratorConfig.ActiveAgents): each
	// step re-sends the loop's whole context, grown by the previous
	// step's short answer and a long tool result. Zero (the default)
	// generates none.
	Agent float64
}

// GeneratorConfig configures Generate. Start from DefaultGeneratorConfig.
type GeneratorConfig struct {
	// Seed makes the workload reproducible: the same config and seed give
	// the same requests, byte for byte.
	Seed uint64
	// Requests is the number of requests to generate.
	Requests int
	// RatePerSecond is the mean arrival rate; arrivals are Poisson and
	// timestamps are whole milliseconds.
	RatePerSecond float64
	// Mix weighs the kinds of request.
	Mix Mix
	// SystemPrompts is the number of distinct shared system prompts.
	SystemPrompts int
	// SystemPromptZipf is the Zipf exponent (> 1) of system prompt
	// popularity: a few prompts serve most conversations.
	SystemPromptZipf float64
	// SystemPromptTokens is the length of a system prompt.
	SystemPromptTokens Range
	// ActiveConversations is how many conversations are open at once; a
	// chat request continues one of them or opens a new one in a free
	// slot. It sets the reuse distance between turns of a conversation.
	ActiveConversations int
	// MeanTurns is the mean number of turns of a conversation (geometric).
	MeanTurns float64
	// UserTokens is the length of a user message or a document question.
	UserTokens Range
	// OutputTokens is the length of a model answer.
	OutputTokens Range
	// MaxInputTokens ends a conversation whose next input would exceed it
	// (the model's context window).
	MaxInputTokens int
	// DocumentTokens is the length of a one-shot document.
	DocumentTokens Range
	// DocumentPromptShare is the fraction of document requests that start
	// with a shared system prompt, in [0, 1].
	DocumentPromptShare float64
	// ScanBurst is the number of back-to-back requests in one scan.
	ScanBurst int
	// ScanTokens is the length of a scan request.
	ScanTokens Range

	// The knobs below are off at their zero values, and a config that
	// leaves them off generates exactly what it did before they existed.

	// ActiveDocuments, when positive, turns one-shot documents into
	// bursty document reuse (RAG over a working set, an analyst or an
	// agent returning to a file): a document request picks one of
	// ActiveDocuments slots and asks a new question about the slot's
	// open document, or opens a new document there. A document takes
	// DocumentQuestions questions on average (geometric), so its reuse
	// distance is about ActiveDocuments document requests and it is then
	// never asked about again.
	ActiveDocuments int
	// DocumentQuestions is the mean number of questions about one
	// document when ActiveDocuments is positive (at least 1).
	DocumentQuestions float64
	// IdleShare is the probability that a conversation goes idle after a
	// turn (a user who leaves and comes back): it gives up its slot and
	// takes its next turn after an idle gap, then may go idle again.
	// Zero (the default) keeps every conversation in its slot.
	IdleShare float64
	// IdleRequests is the mean idle gap in requests (exponential).
	IdleRequests float64
	// ActiveAgents is the number of agent loops open at once when
	// Mix.Agent is positive; few loops mean short reuse distances.
	ActiveAgents int
	// AgentSteps is the mean number of steps of an agent loop
	// (geometric, at least 1).
	AgentSteps float64
	// ToolTokens is the length of a tool result appended at each step.
	ToolTokens Range
	// AgentOutputTokens is the length of an agent step's answer (tool
	// calls are short).
	AgentOutputTokens Range
}

// DefaultGeneratorConfig returns the embedded default workload of `kvtier
// replay`: 20,000 requests (about 215k blocks; all policies at three
// capacities replay in a few seconds) whose hit rate depends on capacity
// over the 1M-10M token range and on the policy. 80% of requests are turns
// of conversations (1024 open at once, 8 turns on average) behind 32
// Zipf-popular system prompts, so a conversation comes back after about a
// thousand other requests; 10% are one-shot documents and 10% scans that
// pollute a recency-only cache. With seed 1 the infinite-cache token hit
// rate is about 61%, LRU reaches about 31%, 42% and 60% at 1M, 3M and 10M
// tokens, and Belady about 51%, 61% and 61%.
func DefaultGeneratorConfig() GeneratorConfig {
	return GeneratorConfig{
		Seed:                1,
		Requests:            20000,
		RatePerSecond:       8,
		Mix:                 Mix{Chat: 0.8, Document: 0.1, Scan: 0.1},
		SystemPrompts:       32,
		SystemPromptZipf:    1.2,
		SystemPromptTokens:  Range{Min: 512, Max: 4096},
		ActiveConversations: 1024,
		MeanTurns:           8,
		UserTokens:          Range{Min: 16, Max: 2048},
		OutputTokens:        Range{Min: 16, Max: 1024},
		MaxInputTokens:      128 << 10,
		DocumentTokens:      Range{Min: 2048, Max: 24 << 10},
		DocumentPromptShare: 0.5,
		ScanBurst:           32,
		ScanTokens:          Range{Min: 1024, Max: 8 << 10},
	}
}

// ErrBadGeneratorConfig is wrapped by Generate's errors about its config.
var ErrBadGeneratorConfig = errors.New("bad generator config")

const (
	// MaxGeneratedRequests bounds GeneratorConfig.Requests: Generate
	// holds the whole trace in memory, about 0.6 KiB a request with the
	// default profile (a million requests: 620 MiB of RSS).
	MaxGeneratedRequests = 10_000_000
	// maxGeneratorActive bounds the counts of things the generator keeps
	// live (system prompts, conversations, documents, agents), each an
	// array entry made up front.
	maxGeneratorActive = 1 << 20
)

// Validate checks the config and names the first bad field.
func (c GeneratorConfig) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("generator: %s: %s: %w", field, fmt.Sprintf(format, args...), ErrBadGeneratorConfig)
	}
	switch {
	case c.Requests < 0:
		return bad("Requests", "%d is negative", c.Requests)
	case c.Requests > MaxGeneratedRequests:
		return bad("Requests", "%d: at most %d (a generated trace is held in memory, about 0.6 KiB a request; generate a larger one as several traces with different seeds)", c.Requests, MaxGeneratedRequests)
	case c.SystemPrompts > maxGeneratorActive:
		return bad("SystemPrompts", "%d: at most %d", c.SystemPrompts, maxGeneratorActive)
	case c.ActiveConversations > maxGeneratorActive:
		return bad("ActiveConversations", "%d: at most %d", c.ActiveConversations, maxGeneratorActive)
	case c.ActiveDocuments > maxGeneratorActive:
		return bad("ActiveDocuments", "%d: at most %d", c.ActiveDocuments, maxGeneratorActive)
	case c.ActiveAgents > maxGeneratorActive:
		return bad("ActiveAgents", "%d: at most %d", c.ActiveAgents, maxGeneratorActive)
	case !(c.RatePerSecond > 0) || math.IsInf(c.RatePerSecond, 0):
		return bad("RatePerSecond", "%v: want a positive rate", c.RatePerSecond)
	case c.Mix.Chat < 0 || c.Mix.Document < 0 || c.Mix.Scan < 0 || !(c.Mix.Chat+c.Mix.Document+c.Mix.Scan > 0) || math.IsInf(c.Mix.Chat+c.Mix.Document+c.Mix.Scan, 0):
		return bad("Mix", "%+v: weights must be non-negative, finite, and not all zero", c.Mix)
	case c.SystemPrompts < 1:
		return bad("SystemPrompts", "%d: want at least 1", c.SystemPrompts)
	case !(c.SystemPromptZipf > 1) || math.IsInf(c.SystemPromptZipf, 0):
		return bad("SystemPromptZipf", "%v: want an exponent > 1", c.SystemPromptZipf)
	case c.ActiveConversations < 1:
		return bad("ActiveConversations", "%d: want at least 1", c.ActiveConversations)
	case !(c.MeanTurns >= 1) || math.IsInf(c.MeanTurns, 0):
		return bad("MeanTurns", "%v: want at least 1", c.MeanTurns)
	case !(c.DocumentPromptShare >= 0 && c.DocumentPromptShare <= 1):
		return bad("DocumentPromptShare", "%v: want a fraction in [0, 1]", c.DocumentPromptShare)
	case c.ScanBurst < 1:
		return bad("ScanBurst", "%d: want at least 1", c.ScanBurst)
	case c.Mix.Agent < 0 || math.IsInf(c.Mix.Agent, 0) || math.IsNaN(c.Mix.Agent):
		return bad("Mix.Agent", "%v: want a non-negative, finite weight", c.Mix.Agent)
	case c.ActiveDocuments < 0:
		return bad("ActiveDocuments", "%d is negative", c.ActiveDocuments)
	case c.ActiveDocuments > 0 && !(c.DocumentQuestions >= 1 && !math.IsInf(c.DocumentQuestions, 0)):
		return bad("DocumentQuestions", "%v: want at least 1 when ActiveDocuments is set", c.DocumentQuestions)
	case !(c.IdleShare >= 0 && c.IdleShare <= 1):
		return bad("IdleShare", "%v: want a probability in [0, 1]", c.IdleShare)
	case c.IdleShare > 0 && !(c.IdleRequests >= 1 && !math.IsInf(c.IdleRequests, 0)):
		return bad("IdleRequests", "%v: want at least 1 when IdleShare is set", c.IdleRequests)
	case c.Mix.Agent > 0 && c.ActiveAgents < 1:
		return bad("ActiveAgents", "%d: want at least 1 when Mix.Agent is set", c.ActiveAgents)
	case c.Mix.Agent > 0 && !(c.AgentSteps >= 1 && !math.IsInf(c.AgentSteps, 0)):
		return bad("AgentSteps", "%v: want at least 1 when Mix.Agent is set", c.AgentSteps)
	}
	if c.Mix.Agent > 0 {
		for _, r := range []struct {
			name string
			r    Range
		}{{"ToolTokens", c.ToolTokens}, {"AgentOutputTokens", c.AgentOutputTokens}} {
			if r.r.Min < 1 || r.r.Min > r.r.Max || r.r.Max > 1<<30 {
				return bad(r.name, "%+v: want 1 <= Min <= Max <= 2^30 when Mix.Agent is set", r.r)
			}
		}
	}
	for _, r := range []struct {
		name string
		r    Range
	}{
		{"SystemPromptTokens", c.SystemPromptTokens}, {"UserTokens", c.UserTokens}, {"OutputTokens", c.OutputTokens},
		{"DocumentTokens", c.DocumentTokens}, {"ScanTokens", c.ScanTokens},
	} {
		if r.r.Min < 1 || r.r.Min > r.r.Max || r.r.Max > 1<<30 {
			return bad(r.name, "%+v: want 1 <= Min <= Max <= 2^30", r.r)
		}
	}
	if need := c.SystemPromptTokens.Max + c.UserTokens.Max; c.MaxInputTokens < need {
		return bad("MaxInputTokens", "%d: want at least SystemPromptTokens.Max + UserTokens.Max = %d, so a first turn always fits", c.MaxInputTokens, need)
	}
	return nil
}

// Generate returns cfg.Requests requests in the Mooncake trace format,
// ordered by timestamp. Hash ids are prefix-chained exactly as in a real
// trace: a block's id stands for the whole token prefix up to the block's
// end, so equal ids at equal positions mean equal prefixes, a partial last
// block gets a different id than the full block that later extends it, and
// ids are numbered from 0 in order of first appearance.
func Generate(cfg GeneratorConfig) ([]Request, error) {
	reqs, _, err := generate(cfg)
	return reqs, err
}

// kind is the kind of a generated request.
type kind uint8

const (
	kindChat kind = iota
	kindDocument
	kindScan
	kindAgent
)

// meta describes a generated request, for the package's tests.
type meta struct {
	kind kind
	// conv numbers conversations from 1 (0 for other kinds); turn counts
	// from 0.
	conv, turn int
	// prompt is the system prompt index, -1 for none.
	prompt int
}

// segment is a run of tokens with one content identity.
type segment struct {
	id  uint64
	len int
}

type conversation struct {
	id        int
	prompt    int
	segs      []segment
	turn      int
	turnsLeft int
}

// document is an open document of bursty document reuse.
type document struct {
	segs     []segment // the system prompt (if any) and the document
	prompt   int
	left     int
	sequence int
}

// parked is an idle conversation and the request index of its next turn.
type parked struct {
	c  *conversation
	at int
}

type generator struct {
	cfg     GeneratorConfig
	rng     *rand.Rand
	zipf    *rand.Zipf
	prompts []segment
	nextSeg uint64
	ids     map[[2]uint64]uint64
	convs   []*conversation
	nConvs  int
	now     float64 // ms

	docs   []*document
	idle   []parked // by at, then parking order
	agents []*conversation
	nReqs  int // requests generated so far
}

func generate(cfg GeneratorConfig) ([]Request, []meta, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	g := &generator{
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		ids:   make(map[[2]uint64]uint64),
		convs: make([]*conversation, cfg.ActiveConversations),
	}
	g.zipf = rand.NewZipf(g.rng, cfg.SystemPromptZipf, 1, uint64(cfg.SystemPrompts-1))
	g.docs = make([]*document, cfg.ActiveDocuments)
	if cfg.Mix.Agent > 0 {
		g.agents = make([]*conversation, cfg.ActiveAgents)
	}
	for range cfg.SystemPrompts {
		g.prompts = append(g.prompts, g.newSegment(cfg.SystemPromptTokens))
	}
	// A scan burst emits ScanBurst requests, so it starts with probability
	// proportional to its weight / ScanBurst: the share of scan requests
	// is then the Scan weight's share.
	wChat, wDoc, wScan := cfg.Mix.Chat, cfg.Mix.Document, cfg.Mix.Scan/float64(cfg.ScanBurst)
	// NB: the agent weight is drawn as the top slice of the range, so a
	// config without agents draws exactly as before.
	wAgent := cfg.Mix.Agent
	total := wChat + wDoc + wScan + wAgent
	reqs := make([]Request, 0, cfg.Requests)
	metas := make([]meta, 0, cfg.Requests)
	scanLeft := 0
	for len(reqs) < cfg.Requests {
		var segs []segment
		var m meta
		out := g.sampleRange(cfg.OutputTokens)
		switch u := g.rng.Float64() * total; {
		case scanLeft == 0 && u >= wChat+wDoc+wScan:
			segs, m, out = g.agentStep()
		case scanLeft > 0 || u >= wChat+wDoc:
			if scanLeft == 0 {
				scanLeft = cfg.ScanBurst
			}
			scanLeft--
			segs = []segment{g.newSegment(cfg.ScanTokens)}
			m = meta{kind: kindScan, prompt: -1}
		case u < wChat:
			segs, m, out = g.chatTurn()
		case len(g.docs) > 0:
			segs, m = g.documentQuestion()
		default:
			m = meta{kind: kindDocument, prompt: -1}
			if g.rng.Float64() < cfg.DocumentPromptShare {
				m.prompt = g.pickPrompt()
				segs = append(segs, g.prompts[m.prompt])
			}
			segs = append(segs, g.newSegment(cfg.DocumentTokens), g.newSegment(cfg.UserTokens))
		}
		g.now += g.rng.ExpFloat64() * 1000 / cfg.RatePerSecond
		req := Request{Timestamp: int64(g.now), OutputLength: out}
		req.InputLength, req.HashIDs = g.blocks(segs)
		reqs = append(reqs, req)
		metas = append(metas, m)
		g.nReqs++
	}
	return reqs, metas, nil
}

// documentQuestion asks a new question about the document open in a
// random slot, opening one there first if the slot is free.
func (g *generator) documentQuestion() ([]segment, meta) {
	slot := g.rng.IntN(len(g.docs))
	d := g.docs[slot]
	if d == nil {
		d = &document{prompt: -1, left: g.geometric(g.cfg.DocumentQuestions)}
		if g.rng.Float64() < g.cfg.DocumentPromptShare {
			d.prompt = g.pickPrompt()
			d.segs = append(d.segs, g.prompts[d.prompt])
		}
		d.segs = append(d.segs, g.newSegment(g.cfg.DocumentTokens))
		g.docs[slot] = d
	}
	segs := append(append([]segment(nil), d.segs...), g.newSegment(g.cfg.UserTokens))
	m := meta{kind: kindDocument, prompt: d.prompt, turn: d.sequence}
	d.sequence++
	d.left--
	if d.left == 0 {
		g.docs[slot] = nil
	}
	return segs, m
}

// agentStep takes the next step of the agent loop in a random slot,
// opening one there first if the slot is free: the loop's context grows by
// the previous answer and a tool result at every step.
func (g *generator) agentStep() ([]segment, meta, int) {
	slot := g.rng.IntN(len(g.agents))
	a := g.agents[slot]
	tool := g.newSegment(g.cfg.ToolTokens)
	if a != nil && tokens(a.segs)+tool.len > g.cfg.MaxInputTokens {
		a = nil // context window full: the loop ends here
	}
	if a == nil {
		g.nConvs++
		a = &conversation{id: g.nConvs, prompt: g.pickPrompt(), turnsLeft: g.geometric(g.cfg.AgentSteps)}
		a.segs = []segment{g.prompts[a.prompt], g.newSegment(g.cfg.UserTokens)}
		g.agents[slot] = a
	} else {
		a.turn++
		a.segs = append(a.segs, tool)
	}
	segs := append([]segment(nil), a.segs...)
	out := g.newSegment(g.cfg.AgentOutputTokens)
	m := meta{kind: kindAgent, conv: a.id, turn: a.turn, prompt: a.prompt}
	a.turnsLeft--
	if a.turnsLeft == 0 {
		g.agents[slot] = nil
	} else {
		a.segs = append(a.segs, out)
	}
	return segs, m, out.len
}

// geometric draws a count >= 1 with the given mean.
func (g *generator) geometric(mean float64) int {
	n := 1
	if p := 1 / mean; p < 1 {
		n = 1 + int(math.Floor(math.Log(1-g.rng.Float64())/math.Log(1-p)))
	}
	return n
}

// park makes c idle until about IdleRequests requests from now.
func (g *generator) park(c *conversation) {
	at := g.nReqs + 1 + int(g.rng.ExpFloat64()*g.cfg.IdleRequests)
	i := len(g.idle)
	for i > 0 && g.idle[i-1].at > at {
		i--
	}
	g.idle = append(g.idle, parked{})
	copy(g.idle[i+1:], g.idle[i:])
	g.idle[i] = parked{c: c, at: at}
}

// chatTurn continues or opens the conversation in a random slot and
// returns the turn's segments and its output length.
func (g *generator) chatTurn() ([]segment, meta, int) {
	if len(g.idle) > 0 && g.idle[0].at <= g.nReqs {
		// An idle conversation comes back and takes this turn.
		c := g.idle[0].c
		g.idle = g.idle[1:]
		return g.idleTurn(c)
	}
	slot := g.rng.IntN(len(g.convs))
	c := g.convs[slot]
	user := g.newSegment(g.cfg.UserTokens)
	if c != nil && tokens(c.segs)+user.len > g.cfg.MaxInputTokens {
		c = nil // context window full: the conversation ends here
	}
	if c == nil {
		g.nConvs++
		c = &conversation{id: g.nConvs, prompt: g.pickPrompt()}
		// Geometric number of turns with mean MeanTurns (at least 1).
		c.turnsLeft = 1
		if p := 1 / g.cfg.MeanTurns; p < 1 {
			c.turnsLeft = 1 + int(math.Floor(math.Log(1-g.rng.Float64())/math.Log(1-p)))
		}
		c.segs = []segment{g.prompts[c.prompt]}
		g.convs[slot] = c
	} else {
		c.turn++
	}
	c.segs = append(c.segs, user)
	segs := append([]segment(nil), c.segs...)
	out := g.newSegment(g.cfg.OutputTokens)
	m := meta{kind: kindChat, conv: c.id, turn: c.turn, prompt: c.prompt}
	c.turnsLeft--
	if c.turnsLeft == 0 {
		g.convs[slot] = nil
	} else {
		// The next turn's input holds this turn's answer.
		c.segs = append(c.segs, out)
		if g.cfg.IdleShare > 0 && g.rng.Float64() < g.cfg.IdleShare {
			g.convs[slot] = nil
			g.park(c)
		}
	}
	return segs, m, out.len
}

// idleTurn is the turn of conversation c back from an idle gap; c goes
// idle again after it with probability IdleShare, else it ends (its slot
// was given away).
func (g *generator) idleTurn(c *conversation) ([]segment, meta, int) {
	user := g.newSegment(g.cfg.UserTokens)
	c.turn++
	c.segs = append(c.segs, user)
	segs := append([]segment(nil), c.segs...)
	out := g.newSegment(g.cfg.OutputTokens)
	m := meta{kind: kindChat, conv: c.id, turn: c.turn, prompt: c.prompt}
	c.turnsLeft--
	if c.turnsLeft > 0 && tokens(c.segs)+out.len+g.cfg.UserTokens.Max <= g.cfg.MaxInputTokens && g.rng.Float64() < g.cfg.IdleShare {
		c.segs = append(c.segs, out)
		g.park(c)
	}
	return segs, m, out.len
}

func (g *generator) pickPrompt() int { return int(g.zipf.Uint64()) }

func (g *generator) newSegment(r Range) segment {
	g.nextSeg++
	return segment{id: g.nextSeg, len: g.sampleRange(r)}
}

// sampleRange draws log-uniformly from r.
func (g *generator) sampleRange(r Range) int {
	if r.Min == r.Max {
		return r.Min
	}
	lo, hi := math.Log(float64(r.Min)), math.Log(float64(r.Max)+1)
	v := int(math.Exp(lo + g.rng.Float64()*(hi-lo)))
	return min(max(v, r.Min), r.Max)
}

func tokens(segs []segment) int {
	n := 0
	for _, s := range segs {
		n += s.len
	}
	return n
}

// blocks returns the input length of segs and the ids of its blocks. A
// block's identity is a fingerprint chained over the previous block's and
// the (segment, offset range) pieces the block holds, so it stands for the
// whole prefix; ids are handed out in order of first appearance.
func (g *generator) blocks(segs []segment) (int, []uint64) {
	n := tokens(segs)
	ids := make([]uint64, 0, Blocks(n))
	var fp [2]uint64
	si, off := 0, 0 // current segment and offset in it
	for start := 0; start < n; start += BlockTokens {
		end := min(start+BlockTokens, n)
		h0, h1 := mix(fp[0], 0x243f6a8885a308d3), mix(fp[1], 0x13198a2e03707344)
		for pos := start; pos < end; {
			take := min(segs[si].len-off, end-pos)
			for _, v := range [3]uint64{segs[si].id, uint64(off), uint64(off + take)} {
				h0, h1 = mix(h0, v), mix(h1, v^0xa4093822299f31d0)
			}
			pos += take
			off += take
			if off == segs[si].len {
				si, off = si+1, 0
			}
		}
		fp = [2]uint64{h0, h1}
		id, ok := g.ids[fp]
		if !ok {
			id = uint64(len(g.ids))
			g.ids[fp] = id
		}
		ids = append(ids, id)
	}
	return n, ids
}

// mix folds v into h (splitmix64 finaliser over h+v), a strong 64-bit
// mixer; two independently seeded lanes make a 128-bit fingerprint, so
// distinct prefixes practically never share an id.
func mix(h, v uint64) uint64 {
	z := h + v + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// CheckChains checks the prefix-chain property of a trace: every hash id
// appears at one position only and always after the same id (or always
// first). A trace that breaks it cannot have come from prefix hashing, and
// replaying it would count hits on blocks whose prefixes differ.
func CheckChains(reqs []Request) error {
	type place struct {
		pos    int
		parent uint64
		hasPar bool
		req    int
	}
	seen := make(map[uint64]place)
	for i, r := range reqs {
		for pos, id := range r.HashIDs {
			p := place{pos: pos, req: i}
			if pos > 0 {
				p.parent, p.hasPar = r.HashIDs[pos-1], true
			}
			if q, ok := seen[id]; ok {
				if q.pos != p.pos || q.hasPar != p.hasPar || q.parent != p.parent {
					return fmt.Errorf("request %d: hash id %d at position %d (after %s) was at position %d (after %s) in request %d: %w",
						i, id, pos, parentString(p.hasPar, p.parent), q.pos, parentString(q.hasPar, q.parent), q.req, ErrMalformed)
				}
				continue
			}
			seen[id] = p
		}
	}
	return nil
}

func parentString(has bool, id uint64) string {
	if !has {
		return "nothing"
	}
	return fmt.Sprintf("id %d", id)
}
