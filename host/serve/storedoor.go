package serve

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"

	storepb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/host/assemble"
	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/host/pagestore"
	"github.com/kvtier/kvtier/host/stack"
)

//go:embed store.yaml
var storeYAML string

// StoreYAML returns the embedded default stack of the page-store door
// (with its {{DIR}} and {{DIRHASH}} placeholders).
func StoreYAML() string { return storeYAML }

// The doors serve can open on its socket (Config.Doors).
const (
	DoorEngine = "engine"
	DoorStore  = "store"
)

// ParseDoors parses a comma-separated list of doors ("engine,store").
func ParseDoors(s string) ([]string, error) {
	var out []string
	for _, d := range strings.Split(s, ",") {
		d = strings.TrimSpace(d)
		switch d {
		case DoorEngine, DoorStore:
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		case "":
		default:
			return nil, fmt.Errorf("door %q: want %q or %q", d, DoorEngine, DoorStore)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("doors %q: name at least one of %q and %q", s, DoorEngine, DoorStore)
	}
	return out, nil
}

// storeDoor is the page-store door kvtier.store.v1 and its own stack (a
// slab and stores, no pool): one door for every client of the node.
type storeDoor struct {
	door      *pagestore.Door
	st        *stack.Stack
	closeHook func() error
	once      sync.Once
	err       error
}

func (s *Server) door(name string) bool {
	if len(s.cfg.Doors) == 0 {
		return name == DoorEngine
	}
	return slices.Contains(s.cfg.Doors, name)
}

// openStoreDoor opens the door's stack from cfg.StoreYAML or the
// embedded default, under DataDir/store.
func (s *Server) openStoreDoor(ctx context.Context) (err error) {
	text, name := s.cfg.StoreYAML, s.cfg.StoreConfigName
	if text == "" && name == "" {
		text, name = storeYAML, "embedded default store stack"
	}
	if name == "" {
		name = "store config"
	}
	dir := filepath.Join(s.cfg.DataDir, "store")
	for _, d := range []string{dir, filepath.Join(dir, "index"), filepath.Join(dir, "l3")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("store door: %w", err)
		}
	}
	st, regs, err := assemble.Load([]byte(expand(text, s.cfg, 0, 1)), name)
	if err != nil {
		return fmt.Errorf("store door: %w", err)
	}
	for _, t := range st.Tiers {
		if t.Role == config.RolePool {
			return fmt.Errorf("store door: %s: tier %q is a pool; the store door's stack is a slab and stores (the clients keep their own L1)", name, t.Name)
		}
	}
	newEv, err := assemble.Evictor(st, "serve")
	if err != nil {
		return fmt.Errorf("store door: %s: %w", name, err)
	}
	log := s.log.With("door", "store")
	stk, err := stack.Open(ctx, st, regs, stack.Options{Logger: log, StackID: "serve-store", ColdStart: s.cfg.ColdStart, IndexDir: filepath.Join(dir, "index")})
	if err != nil {
		return fmt.Errorf("store door: %s: %w", name, err)
	}
	sd := &storeDoor{st: stk}
	defer func() {
		if err != nil {
			if sd.closeHook != nil {
				_ = sd.closeHook()
			}
			_ = stk.Close()
		}
	}()
	if s.cfg.StoreStores != nil {
		if sd.closeHook, err = s.cfg.StoreStores(ctx, stk); err != nil {
			return fmt.Errorf("store door: stores hook: %w", err)
		}
	}
	opt := pagestore.Options{Slab: stk.Slab, Payload: st.Payload, NewEvictor: newEv, BootID: s.boot, StateDir: dir,
		Limits: s.cfg.StoreLimits, SkipVerify: s.cfg.StoreSkipVerify, ConnOf: connOf, Logger: log}
	if len(stk.Stores) > 0 {
		opt.Store, opt.StoreName = stk.Stores[0].Store, stk.Stores[0].Name
	}
	if sd.door, err = pagestore.Open(opt); err != nil {
		return fmt.Errorf("store door: %w", err)
	}
	s.store = sd
	log.Info("kvtier serve: store door open", "config", name, "slab_pages", sd.door.Slots(), "store", opt.StoreName)
	return nil
}

// registerStore serves the door on gs, when it is open.
func (s *Server) registerStore(gs *grpc.Server) {
	if s.store != nil {
		storepb.RegisterStoreServer(gs, s.store.door)
	}
}

// closeStore ends the door's sessions and closes its stack (the stores
// settle their in-flight puts, then the slab goes).
func (s *Server) closeStore() error {
	sd := s.store
	if sd == nil {
		return nil
	}
	sd.once.Do(func() {
		var errs []error
		stopErr := sd.door.Stop()
		if sd.closeHook != nil {
			if err := sd.closeHook(); err != nil {
				errs = append(errs, fmt.Errorf("store door: stores hook: %w", err))
			}
		}
		if errors.Is(stopErr, pagestore.ErrBusy) {
			// A store never returned: leave the slab mapped (the
			// process is ending) rather than unmap bytes in use.
			sd.err = fmt.Errorf("store door: %w (its stack is left open)", stopErr)
			return
		}
		if err := sd.st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store door: %w", err))
		}
		sd.err = errors.Join(errs...)
	})
	return sd.err
}

// StoreDoor returns the page-store door (nil when it is off), for tests
// and benchmarks in this process.
func (s *Server) StoreDoor() *pagestore.Door {
	if s.store == nil {
		return nil
	}
	return s.store.door
}
