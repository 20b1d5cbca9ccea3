// Package filestore is a file-per-page store written the way SGLang's
// built-in HiCache file backend works: one file per page under a directory,
// a set writes a temp file and renames it into place, a get reads the file
// into the caller's preallocated buffer (readinto). It is the baseline that
// `kvtier bench store` compares the page-store door against on the same
// disk; it is a real store, not a fake.
package filestore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
)

// Store keeps each page in its own file under Dir.
type Store struct {
	dir string
	tmp atomic.Uint64
}

// Open makes dir if needed and returns a store over it.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("filestore: open %s: %w", dir, err)
	}
	return &Store{dir: dir}, nil
}

// Dir is the directory the pages live in.
func (s *Store) Dir() string { return s.dir }

// path names a key's file; keys are hex-encoded so any byte string is a
// safe file name.
func (s *Store) path(key string) (string, error) {
	if key == "" {
		return "", errors.New("filestore: empty key")
	}
	if len(key) > 100 {
		return "", fmt.Errorf("filestore: key of %d bytes is over 100", len(key))
	}
	return filepath.Join(s.dir, hex.EncodeToString([]byte(key))+".bin"), nil
}

// Exists reports whether key has a page.
func (s *Store) Exists(key string) (bool, error) {
	p, err := s.path(key)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, fmt.Errorf("filestore: exists %q: %w", key, err)
}

// Set writes page under key: a temp file in the same directory, then a
// rename, so a reader sees the old page or the whole new one.
func (s *Store) Set(key string, page []byte) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	tmp := p + ".tmp" + strconv.FormatUint(s.tmp.Add(1), 10)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("filestore: set %q: %w", key, err)
	}
	if _, err := f.Write(page); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("filestore: set %q: write: %w", key, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("filestore: set %q: close: %w", key, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("filestore: set %q: rename: %w", key, err)
	}
	return nil
}

// Get reads key's page into buf, which must be exactly the page's length.
// It reports false, nil for a missing key.
func (s *Store) Get(key string, buf []byte) (bool, error) {
	p, err := s.path(key)
	if err != nil {
		return false, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("filestore: get %q: %w", key, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("filestore: get %q: stat: %w", key, err)
	}
	if st.Size() != int64(len(buf)) {
		return false, fmt.Errorf("filestore: get %q: page is %d bytes, buffer %d", key, st.Size(), len(buf))
	}
	if _, err := io.ReadFull(f, buf); err != nil {
		return false, fmt.Errorf("filestore: get %q: read: %w", key, err)
	}
	return true, nil
}

// BatchExists returns how many leading keys have pages, as SGLang's
// batch_exists does.
func (s *Store) BatchExists(keys []string) (int, error) {
	for i, k := range keys {
		ok, err := s.Exists(k)
		if err != nil {
			return i, err
		}
		if !ok {
			return i, nil
		}
	}
	return len(keys), nil
}

// Clear removes every page and temp file.
func (s *Store) Clear() error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("filestore: clear %s: %w", s.dir, err)
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil {
			return fmt.Errorf("filestore: clear: %w", err)
		}
	}
	return nil
}
