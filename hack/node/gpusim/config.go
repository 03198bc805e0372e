package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// pollInterval is how often both commands look at their config file (and the device
// plugin at the kubelet's socket and its own).
const pollInterval = 500 * time.Millisecond

// Device list and device ID strategies, named as NVIDIA's k8s-device-plugin names them
// (NVIDIA/k8s-device-plugin v0.20.0, api/config/v1/consts.go: DeviceListStrategyEnvVar,
// DeviceListStrategyCDICRI, DeviceListStrategyCDIAnnotations, DeviceIDStrategyUUID,
// DeviceIDStrategyIndex). Its fourth list strategy, volume-mounts, is not simulated.
const (
	strategyEnvVar         = "envvar"
	strategyCDICRI         = "cdi-cri"
	strategyCDIAnnotations = "cdi-annotations"
	idStrategyUUID         = "uuid"
	idStrategyIndex        = "index"
)

// pluginConfig is the device plugin's config file.
type pluginConfig struct {
	// Resource is the extended resource, e.g. "nvidia.com/gpu".
	Resource string `json:"resource"`
	// Strategy is one device list strategy, or several comma-separated as NVIDIA's
	// --device-list-strategy takes them ("envvar,cdi-annotations").
	Strategy string `json:"strategy"`
	// IDStrategy names the IDs Allocate hands out: "uuid" (the default) or "index".
	IDStrategy string         `json:"idStrategy"`
	Devices    []pluginDevice `json:"devices"`
}

type pluginDevice struct {
	Index   int    `json:"index"`
	UUID    string `json:"uuid"`
	Healthy *bool  `json:"healthy,omitempty"` // absent: healthy
}

func (d pluginDevice) healthy() bool { return d.Healthy == nil || *d.Healthy }

// strategies is the set of device list strategies the config names.
func (c *pluginConfig) strategies() map[string]bool {
	out := map[string]bool{}
	for _, s := range strings.Split(c.Strategy, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out[s] = true
		}
	}
	return out
}

var resourceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

func (c *pluginConfig) validate() error {
	if c.Resource == "" {
		c.Resource = "nvidia.com/gpu"
	}
	if !resourceName.MatchString(c.Resource) {
		return fmt.Errorf("resource %q is not of the form vendor.domain/name", c.Resource)
	}
	if c.Strategy == "" {
		c.Strategy = strategyEnvVar
	}
	for s := range c.strategies() {
		switch s {
		case strategyEnvVar, strategyCDICRI, strategyCDIAnnotations:
		default:
			return fmt.Errorf("strategy %q: want %s, %s or %s (comma-separated for several)",
				s, strategyEnvVar, strategyCDICRI, strategyCDIAnnotations)
		}
	}
	if c.IDStrategy == "" {
		c.IDStrategy = idStrategyUUID
	}
	if c.IDStrategy != idStrategyUUID && c.IDStrategy != idStrategyIndex {
		return fmt.Errorf("idStrategy %q: want %s or %s", c.IDStrategy, idStrategyUUID, idStrategyIndex)
	}
	indices, uuids := map[int]bool{}, map[string]bool{}
	for _, d := range c.Devices {
		if d.Index < 0 || indices[d.Index] {
			return fmt.Errorf("device index %d is negative or repeated", d.Index)
		}
		if !validUUID(d.UUID) || uuids[d.UUID] {
			return fmt.Errorf("device %d: UUID %q is empty, has a comma or '=', or is repeated", d.Index, d.UUID)
		}
		indices[d.Index], uuids[d.UUID] = true, true
	}
	return nil
}

// draConfig is the DRA plugin's config file.
type draConfig struct {
	GPUs []draGPU `json:"gpus"`
	// Unhealthy says how an unhealthy GPU is published: "taint" (the default) with a
	// NoSchedule device taint, as the NVIDIA DRA driver's main branch does, or "omit"
	// (left out of the ResourceSlice), as its release v25.12.0 does (see dra.go).
	Unhealthy string `json:"unhealthy,omitempty"`
}

// draGPU is one simulated GPU. Only minor and uuid are required; the rest default to an
// A100-SXM4-40GB on driver 550.54.15 (what NVML reports there).
type draGPU struct {
	Minor                 int    `json:"minor"`
	UUID                  string `json:"uuid"`
	ProductName           string `json:"productName,omitempty"`
	Brand                 string `json:"brand,omitempty"`
	Architecture          string `json:"architecture,omitempty"`
	CUDAComputeCapability string `json:"cudaComputeCapability,omitempty"`
	DriverVersion         string `json:"driverVersion,omitempty"`
	CUDADriverVersion     string `json:"cudaDriverVersion,omitempty"`
	MemoryBytes           int64  `json:"memoryBytes,omitempty"`
	PCIBusID              string `json:"pciBusID,omitempty"`
	// PCIeRoot ("pci0000:3a") is published as resource.kubernetes.io/pcieRoot when set; the
	// real driver resolves it from sysfs and leaves it out when that fails.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	Healthy  *bool  `json:"healthy,omitempty"` // absent: healthy
}

func (g draGPU) healthy() bool { return g.Healthy == nil || *g.Healthy }

func (c *draConfig) validate() error {
	switch c.Unhealthy {
	case "":
		c.Unhealthy = "taint"
	case "taint", "omit":
	default:
		return fmt.Errorf("unhealthy %q: want taint or omit", c.Unhealthy)
	}
	minors, uuids := map[int]bool{}, map[string]bool{}
	for i := range c.GPUs {
		g := &c.GPUs[i]
		if g.Minor < 0 || minors[g.Minor] {
			return fmt.Errorf("gpu minor %d is negative or repeated", g.Minor)
		}
		if !validUUID(g.UUID) || uuids[g.UUID] {
			return fmt.Errorf("gpu %d: UUID %q is empty, has a comma or '=', or is repeated", g.Minor, g.UUID)
		}
		minors[g.Minor], uuids[g.UUID] = true, true
		setDefault(&g.ProductName, "NVIDIA A100-SXM4-40GB")
		setDefault(&g.Brand, "Nvidia")
		setDefault(&g.Architecture, "Ampere")
		setDefault(&g.CUDAComputeCapability, "8.0")
		setDefault(&g.DriverVersion, "550.54.15")
		setDefault(&g.CUDADriverVersion, "12.4")
		setDefault(&g.PCIBusID, fmt.Sprintf("0000:%02x:00.0", 0x07+g.Minor))
		if g.MemoryBytes == 0 {
			g.MemoryBytes = 40960 << 20 // 40960 MiB, an A100 40GB's total memory
		}
		if g.MemoryBytes < 0 {
			return fmt.Errorf("gpu %d: memoryBytes %d is negative", g.Minor, g.MemoryBytes)
		}
	}
	return nil
}

func setDefault(field *string, value string) {
	if *field == "" {
		*field = value
	}
}

func validUUID(uuid string) bool {
	return uuid != "" && !strings.ContainsAny(uuid, ",= \t\n")
}

// readConfig decodes a JSON config strictly (unknown fields are an error).
func readConfig(path string, into interface{ validate() error }) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := into.validate(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// fileStamp identifies one version of a file: a rename over it changes the inode, an
// in-place write the size or the modification time.
type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

// stampOf is the file's stamp, or ok=false when it does not exist (or cannot be read).
func stampOf(path string) (stamp fileStamp, ok bool) {
	info, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, false
	}
	stamp = fileStamp{size: info.Size(), mtime: info.ModTime()}
	if st, isUnix := info.Sys().(*syscall.Stat_t); isUnix {
		stamp.dev, stamp.ino = st.Dev, st.Ino
	}
	return stamp, true
}

// configWatch reloads a config file when its stamp changes.
type configWatch[T any, PT interface {
	*T
	validate() error
}] struct {
	path string
	last fileStamp
}

// load reads the file if it changed since the last successful read: (config, true, nil)
// on a new version, (nil, false, nil) when nothing changed, an error when the new version
// does not parse (the stamp is not kept, so the next poll tries again).
func (w *configWatch[T, PT]) load() (*T, bool, error) {
	stamp, ok := stampOf(w.path)
	if !ok {
		if _, err := os.Stat(w.path); err != nil {
			return nil, false, err
		}
	}
	if stamp == w.last {
		return nil, false, nil
	}
	cfg := PT(new(T))
	if err := readConfig(w.path, cfg); err != nil {
		return nil, false, err
	}
	w.last = stamp
	return (*T)(cfg), true, nil
}
