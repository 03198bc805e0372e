package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// listCDIDevices is every device the CDI library (v1.1.1, as containerd 2.4.2 uses it)
// finds in dir, failing on any spec it refuses.
func listCDIDevices(t *testing.T, dir string) []string {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	for path, errs := range cache.GetErrors() {
		t.Fatalf("CDI refuses %s: %v", path, errs)
	}
	names := cache.ListDevices()
	slices.Sort(names)
	return names
}

// injectCDI is a minimal OCI spec with the CDI devices injected, as containerd does it.
func injectCDI(t *testing.T, dir string, devices ...string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, devices...); err != nil {
		t.Fatalf("injecting %v: %v (unresolved %v)", devices, err, unresolved)
	}
	return spec
}

// checkDeviceNodes: the OCI spec has exactly these device nodes, each the char device 1:3
// of /dev/null, and the cgroup lets the container use it.
func checkDeviceNodes(t *testing.T, spec *oci.Spec, paths ...string) {
	t.Helper()
	var got []string
	for _, d := range spec.Linux.Devices {
		got = append(got, d.Path)
		if d.Type != "c" || d.Major != 1 || d.Minor != 3 {
			t.Errorf("device %s is %s %d:%d, want c 1:3", d.Path, d.Type, d.Major, d.Minor)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, paths) {
		t.Errorf("device nodes = %v, want %v", got, paths)
	}
	if spec.Linux.Resources == nil || len(spec.Linux.Resources.Devices) < len(paths) {
		t.Errorf("no cgroup device rules for %v", paths)
	}
}

// TestRuncRunsCDIDeviceNode: runc (the node's runtime) accepts the device node the CDI
// specs describe, and a container sees /dev/nvidia0 as a char device and its marker env.
// Needs root, runc and a static busybox (Debian's busybox-static); skipped without them.
func TestRuncRunsCDIDeviceNode(t *testing.T) {
	runc, err := exec.LookPath("runc")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and runc")
	}
	busybox := "/usr/bin/busybox"
	if out, err := exec.Command("file", busybox).Output(); err != nil || !strings.Contains(string(out), "statically linked") {
		t.Skip("needs a static busybox at /usr/bin/busybox")
	}
	dir, err := os.MkdirTemp("", "gpusim-runc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cdiDir, bundle := filepath.Join(dir, "cdi"), filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{cdiDir, filepath.Join(rootfs, "bin"), filepath.Join(rootfs, "dev"),
		filepath.Join(rootfs, "proc"), filepath.Join(rootfs, "sys"), filepath.Join(rootfs, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", "sh")); err != nil {
		t.Fatal(err)
	}

	cfg := testPluginConfig("cdi-cri", "uuid")
	p := &devicePlugin{cdiDir: cdiDir, deviceNodes: true, cfg: &cfg}
	if err := p.writeCDISpec(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(runc, "spec", "--bundle", bundle)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	specPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	spec := new(oci.Spec)
	if err := json.Unmarshal(raw, spec); err != nil {
		t.Fatal(err)
	}
	spec.Process.Terminal = false
	spec.Process.Args = []string{"/bin/busybox", "sh", "-c",
		`/bin/busybox stat -c '%F %t:%T' /dev/nvidia0 && echo "SIM=$SIM_GPU_0" && /bin/busybox head -c 1 /dev/nvidia0 | /bin/busybox wc -c`}
	spec.Root.Readonly = false
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(spec, "nvidia.com/gpu="+testUUIDs[0]); err != nil {
		t.Fatal(err)
	}
	raw, err = json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "gpusim-test-" + filepath.Base(dir)
	run := exec.Command(runc, "--root", filepath.Join(dir, "state"), "run", "--bundle", bundle, id)
	out, err := run.CombinedOutput()
	_ = exec.Command(runc, "--root", filepath.Join(dir, "state"), "delete", "--force", id).Run()
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	t.Logf("container output:\n%s", out)
	// stat prints the major:minor in hex; /dev/null's is 1:3. Reading it gives 0 bytes.
	for _, want := range []string{"character special file 1:3", "SIM=" + testUUIDs[0], "0"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("container output lacks %q:\n%s", want, out)
		}
	}
}
