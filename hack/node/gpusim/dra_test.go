package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

func testDRAConfig(unhealthy ...int) *draConfig {
	cfg := &draConfig{}
	for i, u := range testUUIDs {
		healthy := !slices.Contains(unhealthy, i)
		cfg.GPUs = append(cfg.GPUs, draGPU{Minor: i, UUID: u, Healthy: &healthy})
	}
	cfg.GPUs[0].PCIeRoot = "pci0000:00"
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	return cfg
}

// TestSliceShape: the devices are those of NVIDIA's DRA driver v25.12.0 (deviceinfo.go,
// partitions.go): gpu-<minor>, exactly these attributes, memory capacity.
func TestSliceShape(t *testing.T) {
	cfg := testDRAConfig(2)
	res := driverResources("node-a", cfg)
	pool, ok := res.Pools["node-a"]
	if !ok || len(res.Pools) != 1 || len(pool.Slices) != 1 {
		t.Fatalf("pools = %v", res.Pools)
	}
	devices := pool.Slices[0].Devices
	if len(devices) != 3 {
		t.Fatalf("devices = %v", devices)
	}
	d := devices[0]
	if d.Name != "gpu-0" {
		t.Errorf("name = %s", d.Name)
	}
	var keys []string
	for k := range d.Attributes {
		keys = append(keys, string(k))
	}
	slices.Sort(keys)
	want := []string{"architecture", "brand", "cudaComputeCapability", "cudaDriverVersion",
		"driverVersion", "productName", "resource.kubernetes.io/pciBusID",
		"resource.kubernetes.io/pcieRoot", "type", "uuid"}
	if !slices.Equal(keys, want) {
		t.Errorf("attributes = %v, want %v", keys, want)
	}
	str := func(k string) string { return *d.Attributes[resourceapi.QualifiedName(k)].StringValue }
	ver := func(k string) string { return *d.Attributes[resourceapi.QualifiedName(k)].VersionValue }
	if str("type") != "gpu" || str("uuid") != testUUIDs[0] || str("productName") != "NVIDIA A100-SXM4-40GB" ||
		str("brand") != "Nvidia" || str("architecture") != "Ampere" ||
		str("resource.kubernetes.io/pciBusID") != "0000:07:00.0" {
		t.Errorf("string attributes = %v", d.Attributes)
	}
	if ver("cudaComputeCapability") != "8.0.0" || ver("driverVersion") != "550.54.15" || ver("cudaDriverVersion") != "12.4.0" {
		t.Errorf("version attributes = %v", d.Attributes)
	}
	if m := d.Capacity["memory"].Value; m.Value() != 40960<<20 || m.String() != "40Gi" {
		t.Errorf("memory = %v", m.String())
	}
	if len(d.Taints) != 0 || len(devices[1].Taints) != 0 {
		t.Errorf("healthy GPUs have taints: %v %v", d.Taints, devices[1].Taints)
	}
	if _, ok := devices[1].Attributes["resource.kubernetes.io/pcieRoot"]; ok {
		t.Error("pcieRoot published without one configured")
	}
	taints := devices[2].Taints
	if len(taints) != 1 || taints[0].Key != "gpu.nvidia.com/xid" || taints[0].Value != "79" ||
		taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("the unhealthy GPU's taints = %v", taints)
	}

	cfg.Unhealthy = "omit"
	var names []string
	for _, d := range driverResources("node-a", cfg).Pools["node-a"].Slices[0].Devices {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"gpu-0", "gpu-1"}) {
		t.Errorf("with unhealthy=omit: %v", names)
	}
}

func allocatedClaim(uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

// TestPrepareUnprepare: a claim's spec is the transient k8s.gpu.nvidia.com/claim spec of
// the NVIDIA driver (cdi.go), its devices "<claim UID>-gpu-<minor>"; injecting them sets
// NVIDIA_VISIBLE_DEVICES, the markers and the device nodes; Unprepare removes the spec.
func TestPrepareUnprepare(t *testing.T) {
	dir := t.TempDir()
	p := &draPlugin{nodeName: "node-a", cdiDir: dir, deviceNodes: true, cfg: testDRAConfig()}
	const uid = "0b5c1f0e-1111-4222-8333-444455556666"
	claim := allocatedClaim(uid,
		resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-2"},
		resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-0"},
		resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: "node-a", Device: "eth0"},
	)
	results, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	res := results[types.UID(uid)]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	want := []kubeletplugin.Device{
		{Requests: []string{"gpus"}, PoolName: "node-a", DeviceName: "gpu-2",
			CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + uid + "-gpu-2"}},
		{Requests: []string{"gpus"}, PoolName: "node-a", DeviceName: "gpu-0",
			CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + uid + "-gpu-0"}},
	}
	if len(res.Devices) != len(want) {
		t.Fatalf("devices = %+v", res.Devices)
	}
	for i := range want {
		g, w := res.Devices[i], want[i]
		if !slices.Equal(g.Requests, w.Requests) || g.PoolName != w.PoolName || g.DeviceName != w.DeviceName ||
			!slices.Equal(g.CDIDeviceIDs, w.CDIDeviceIDs) {
			t.Errorf("device %d = %+v, want %+v", i, g, w)
		}
	}
	specFile := filepath.Join(dir, "k8s.gpu.nvidia.com-claim_"+uid+".json")
	if _, err := os.Stat(specFile); err != nil {
		t.Fatal(err)
	}
	oci := injectCDI(t, dir, res.Devices[0].CDIDeviceIDs[0], res.Devices[1].CDIDeviceIDs[0])
	for _, env := range []string{"NVIDIA_VISIBLE_DEVICES=" + testUUIDs[2] + "," + testUUIDs[0],
		"SIM_GPU_2=" + testUUIDs[2], "SIM_GPU_0=" + testUUIDs[0]} {
		if !slices.Contains(oci.Process.Env, env) {
			t.Errorf("env lacks %s: %v", env, oci.Process.Env)
		}
	}
	checkDeviceNodes(t, oci, "/dev/nvidia0", "/dev/nvidia2")

	// Preparing again is fine (the kubelet may ask again after a restart).
	if again, _ := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim}); again[types.UID(uid)].Err != nil {
		t.Fatal(again[types.UID(uid)].Err)
	}

	errs, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{
		{UID: types.UID(uid), NamespacedName: types.NamespacedName{Namespace: "ns", Name: "c"}},
	})
	if err != nil || errs[types.UID(uid)] != nil {
		t.Fatalf("unprepare: %v %v", err, errs)
	}
	if _, err := os.Stat(specFile); !os.IsNotExist(err) {
		t.Fatalf("the spec is still there: %v", err)
	}
	// Unpreparing what is not prepared is not an error.
	if errs, _ := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "x"}}); errs["x"] != nil {
		t.Fatal(errs["x"])
	}
}

func TestPrepareRefuses(t *testing.T) {
	p := &draPlugin{nodeName: "node-a", cdiDir: t.TempDir(), cfg: testDRAConfig()}
	for name, claim := range map[string]*resourceapi.ResourceClaim{
		"unallocated":  {ObjectMeta: metav1.ObjectMeta{UID: "u1"}},
		"other pool":   allocatedClaim("u2", resourceapi.DeviceRequestAllocationResult{Driver: "gpu.nvidia.com", Pool: "node-b", Device: "gpu-0"}),
		"other device": allocatedClaim("u3", resourceapi.DeviceRequestAllocationResult{Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-9"}),
	} {
		results, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
		if err != nil || results[claim.UID].Err == nil {
			t.Errorf("%s: prepared (%v, %v)", name, results, err)
		}
	}
	entries, _ := os.ReadDir(p.cdiDir)
	if len(entries) != 0 {
		t.Errorf("specs written for refused claims: %v", entries)
	}
}

func TestDRAConfigValidation(t *testing.T) {
	for _, bad := range []string{
		`{"unhealthy": "hide"}`,
		`{"gpus": [{"minor": 0, "uuid": "GPU-a"}, {"minor": 0, "uuid": "GPU-b"}]}`,
		`{"gpus": [{"minor": 0, "uuid": ""}]}`,
		`{"gpus": [{"minor": 0, "uuid": "GPU-a", "index": 0}]}`,
	} {
		path := filepath.Join(t.TempDir(), "c.json")
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := readConfig(path, new(draConfig)); err == nil {
			t.Errorf("config %s was accepted", bad)
		} else if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name the file", err)
		}
	}
}
