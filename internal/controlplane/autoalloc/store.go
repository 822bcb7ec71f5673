package autoalloc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
)

const stateVersion = 1

// State is what a Store persists.
type State struct {
	Version int `json:"version"`
	// Next4 and Next6 are the allocation cursors: where the next search for
	// a free address starts. Zero means the start of the range.
	Next4 netip.Addr `json:"next4,omitzero"`
	Next6 netip.Addr `json:"next6,omitzero"`
	// Allocations sorted by key.
	Allocations []Allocation `json:"allocations"`
}

func (s State) equal(o State) bool {
	return s.Version == o.Version && s.Next4 == o.Next4 && s.Next6 == o.Next6 && slices.Equal(s.Allocations, o.Allocations)
}

// Store persists allocator state.
type Store interface {
	// Load returns the saved state; a store that was never saved returns the
	// zero State and no error.
	Load() (State, error)
	// Save replaces the saved state.
	Save(State) error
}

// FileStore keeps the state as JSON in one file, replaced atomically
// (write to a temporary file, then rename). Local mode uses
// <state-dir>/se-addresses.json.
type FileStore struct {
	Path string
}

// DefaultFileName is the state file's name inside the state directory.
const DefaultFileName = "se-addresses.json"

// Load implements Store.
func (f FileStore) Load() (State, error) {
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("autoalloc: read state: %w", err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return State{}, fmt.Errorf("autoalloc: state file %s is corrupt (delete it to start over; addresses may change): %w", f.Path, err)
	}
	if st.Version != stateVersion {
		return State{}, fmt.Errorf("autoalloc: state file %s has version %d, want %d", f.Path, st.Version, stateVersion)
	}
	return st, nil
}

// Save implements Store.
func (f FileStore) Save(st State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("autoalloc: encode state: %w", err)
	}
	dir := filepath.Dir(f.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("autoalloc: state dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".se-addresses-*")
	if err != nil {
		return fmt.Errorf("autoalloc: save state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("autoalloc: save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("autoalloc: save state: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("autoalloc: save state: %w", err)
	}
	return nil
}
