package netns

// SetRestoreForTest replaces the switch back to the original namespace in Do,
// so tests can exercise the failure path.
func SetRestoreForTest(h *Handle, restore func(origFD int) error) { h.restore = restore }
