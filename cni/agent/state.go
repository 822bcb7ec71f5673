package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// savedPod is one entry of the state file: a pod whose rules are in place.
type savedPod struct {
	UID            string            `json:"uid"`
	Namespace      string            `json:"namespace"`
	Name           string            `json:"name"`
	ServiceAccount string            `json:"serviceAccount"`
	IPs            []netip.Addr      `json:"ips"`
	Netns          string            `json:"netns"`
	NetnsDev       uint64            `json:"netnsDev"`
	NetnsIno       uint64            `json:"netnsIno"`
	Settings       rules.PodSettings `json:"settings"`
	State          State             `json:"state"`
	Via            string            `json:"via"`
}

type stateFile struct {
	Version int        `json:"version"`
	Pods    []savedPod `json:"pods"`
	// Sandboxes are the netns paths CNI ADDs reported for pods by UID
	// (captured or not), the proof a later enrollment by relabel uses.
	Sandboxes map[string]string `json:"sandboxes,omitempty"`
}

const stateVersion = 1

// persist writes the pods with rules in place and an open netns to the state
// file (atomically). Failures are logged: the state file only matters for the
// next agent's start.
func (a *Agent) persist() {
	a.persistMu.Lock()
	defer a.persistMu.Unlock()
	a.mu.Lock()
	st := stateFile{Version: stateVersion, Pods: []savedPod{}, Sandboxes: map[string]string{}}
	for uid, l := range a.learned {
		st.Sandboxes[uid] = l.path
	}
	for _, r := range a.pods {
		if r.ns == nil || !r.rulesIn {
			continue
		}
		st.Pods = append(st.Pods, savedPod{
			UID: r.uid, Namespace: r.namespace, Name: r.name, ServiceAccount: r.info.GetServiceAccount(),
			IPs: r.ips, Netns: r.netnsPath, NetnsDev: r.nsID.Dev, NetnsIno: r.nsID.Ino,
			Settings: r.settings, State: r.state, Via: r.via,
		})
	}
	a.mu.Unlock()
	if err := writeState(a.statePath(), st); err != nil {
		a.log.Error("writing the agent state file failed; a restarted agent will not know every enrolled pod", zap.Error(err))
	}
}

func writeState(path string, st stateFile) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("agent: encode state: %w", err)
	}
	if err := ensureDir(path); err != nil {
		return fmt.Errorf("agent: state dir: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("agent: write state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("agent: write state: %w", err)
	}
	return nil
}

func readState(path string) (stateFile, error) {
	var st stateFile
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("agent: read state: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("agent: decode state %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return stateFile{}, fmt.Errorf("agent: state %s has version %d, want %d", path, st.Version, stateVersion)
	}
	return st, nil
}

// restore loads the state file: each pod whose netns still exists (same
// namespace identity as recorded) is tracked again, announced to proxies in
// the ZDS snapshot, and its IPs put back in the probe ipset. Pods whose
// netns is gone are forgotten (the pod was deleted, or its sandbox
// recreated, which brings a new CNI ADD). It returns the number restored.
func (a *Agent) restore() int {
	st, err := readState(a.statePath())
	if err != nil {
		a.log.Error("ignoring the agent state file", zap.Error(err))
		return 0
	}
	a.mu.Lock()
	for uid, path := range st.Sandboxes {
		a.learned[uid] = learnedNetns{path: path, at: time.Now()}
	}
	a.mu.Unlock()
	n := 0
	for _, sp := range st.Pods {
		log := a.log.With(zap.String("pod", sp.Namespace+"/"+sp.Name), zap.String("uid", sp.UID), zap.String("netns", sp.Netns))
		h, err := netns.Open(sp.Netns)
		if err != nil {
			log.Info("forgetting remembered pod: its network namespace is gone", zap.Error(err))
			continue
		}
		if id := h.ID(); id.Dev != sp.NetnsDev || id.Ino != sp.NetnsIno {
			h.Close()
			log.Info("forgetting remembered pod: its network namespace was replaced")
			continue
		}
		state := sp.State
		if state != StateEnabled {
			state = StatePending
		}
		rec := &podRec{
			uid: sp.UID, namespace: sp.Namespace, name: sp.Name,
			info: &zdsapi.WorkloadInfo{Name: sp.Name, Namespace: sp.Namespace, ServiceAccount: sp.ServiceAccount},
			ips:  sp.IPs, netnsPath: sp.Netns, ns: h, nsID: h.ID(), settings: sp.Settings, rulesIn: true,
			state: state, via: viaRestored, since: time.Now(),
		}
		if err := a.cfg.Host.AddPodIPs(rec.ips); err != nil {
			log.Warn("adding pod IPs to the probe ipset failed", zap.Error(err))
		}
		a.mu.Lock()
		a.pods[rec.uid] = rec
		if sp.Via == viaCNI { // a sandbox path the runtime named, not a /proc one
			a.learned[rec.uid] = learnedNetns{path: rec.netnsPath, at: time.Now()}
		}
		a.mu.Unlock()
		log.Info("restored enrolled pod", zap.String("redirection", string(state)), zap.String("settings", settingsSummary(sp.Settings)))
		n++
	}
	a.persist()
	return n
}
