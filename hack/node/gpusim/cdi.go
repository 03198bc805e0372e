package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// cdiVersion is the version written into every spec: containerd 2.4.2 reads specs with
// tags.cncf.io/container-device-interface v1.1.1 (its go.mod), which accepts 0.3.0 to 1.1.0;
// 0.6.0 is what nvidia-ctk wrote for years and covers every field used here.
const cdiVersion = "0.6.0"

// markerEnv is the env var a simulated GPU puts into a container, so a test can see which
// GPUs a container was given: SIM_GPU_<minor>=<uuid>.
func markerEnv(minor int, uuid string) string {
	return fmt.Sprintf("SIM_GPU_%d=%s", minor, uuid)
}

// deviceEdits are one simulated GPU's container edits: its marker env and, with nodes, a
// character device /dev/nvidia<minor> in the container. There is no GPU behind it: its
// host path is /dev/null, so the container gets a char device 1:3 under the GPU's name
// (the CDI library reads type, major and minor from the host path; runc creates the node).
func deviceEdits(minor int, uuid string, nodes bool) cdispec.ContainerEdits {
	edits := cdispec.ContainerEdits{Env: []string{markerEnv(minor, uuid)}}
	if nodes {
		edits.DeviceNodes = []*cdispec.DeviceNode{{
			Path:     fmt.Sprintf("/dev/nvidia%d", minor),
			HostPath: "/dev/null",
		}}
	}
	return edits
}

// mergeEdits is the union of several devices' edits (for the device named "all").
func mergeEdits(all ...cdispec.ContainerEdits) cdispec.ContainerEdits {
	var out cdispec.ContainerEdits
	for _, e := range all {
		out.Env = append(out.Env, e.Env...)
		out.DeviceNodes = append(out.DeviceNodes, e.DeviceNodes...)
	}
	return out
}

// writeSpec writes a CDI spec as <dir>/<name>.json, atomically (a temporary file renamed
// over it), so a runtime never reads half a spec.
func writeSpec(dir, name string, spec *cdispec.Spec) (string, error) {
	spec.Version = cdiVersion
	if err := cdispec.ValidateVersion(spec); err != nil {
		return "", fmt.Errorf("CDI spec %s: %w", name, err)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".json")
	tmp, err := os.CreateTemp(dir, "."+name+".*.tmp")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return path, os.Rename(tmp.Name(), path)
}

// removeSpec removes <dir>/<name>.json; a spec that is not there is not an error.
func removeSpec(dir, name string) error {
	err := os.Remove(filepath.Join(dir, name+".json"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// splitResource splits "nvidia.com/gpu" into the CDI vendor and class, "nvidia.com" and
// "gpu": the device plugin's CDI kind is its resource name, as with NVIDIA's plugin
// (vendor nvidia.com, class gpu).
func splitResource(resource string) (vendor, class string) {
	vendor, class, _ = strings.Cut(resource, "/")
	return vendor, class
}
