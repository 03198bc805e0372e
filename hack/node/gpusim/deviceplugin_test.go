package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var testUUIDs = []string{
	"GPU-00000000-0000-4000-8000-000000000000",
	"GPU-11111111-1111-4111-8111-111111111111",
	"GPU-22222222-2222-4222-8222-222222222222",
}

// fakeKubelet serves the kubelet's Registration service on kubelet.sock and hands each
// RegisterRequest to the test.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	server   *grpc.Server
	requests chan *pluginapi.RegisterRequest
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	path := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{server: grpc.NewServer(), requests: make(chan *pluginapi.RegisterRequest, 10)}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(listener) }()
	t.Cleanup(k.server.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- req
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) expectRegister(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case req := <-k.requests:
		return req
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register within 10s")
		return nil
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func testPluginConfig(strategy, idStrategy string, unhealthy ...int) pluginConfig {
	cfg := pluginConfig{Resource: "nvidia.com/gpu", Strategy: strategy, IDStrategy: idStrategy}
	for i, u := range testUUIDs {
		healthy := !slices.Contains(unhealthy, i)
		cfg.Devices = append(cfg.Devices, pluginDevice{Index: i, UUID: u, Healthy: &healthy})
	}
	return cfg
}

func dialPlugin(t *testing.T, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func healthOf(devices []*pluginapi.Device) map[string]string {
	out := map[string]string{}
	for _, d := range devices {
		out[d.ID] = d.Health
	}
	return out
}

// TestDevicePluginLifecycle runs the plugin against a fake kubelet: Register, ListAndWatch,
// a health change through the config file, Allocate over gRPC, re-registration after the
// kubelet restarts (plugin socket deleted, new kubelet.sock), and a clean stop.
func TestDevicePluginLifecycle(t *testing.T) {
	// A short directory: a Unix socket path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "gpusim")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pluginDir, cdiDir := filepath.Join(dir, "dp"), filepath.Join(dir, "cdi")
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(dir, "config.json")
	writeJSON(t, configPath, testPluginConfig("envvar", "uuid"))
	kubelet := startFakeKubelet(t, pluginDir)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runDevicePlugin(ctx, []string{
			"--config", configPath, "--plugin-dir", pluginDir, "--cdi-dir", cdiDir,
		})
	}()

	req := kubelet.expectRegister(t)
	if req.Version != "v1beta1" || req.Endpoint != "nvidia-gpu.sock" ||
		req.ResourceName != "nvidia.com/gpu" || !req.Options.GetGetPreferredAllocationAvailable() {
		t.Fatalf("RegisterRequest = %v", req)
	}
	socket := filepath.Join(pluginDir, req.Endpoint)
	client := dialPlugin(t, socket)

	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions = %v, %v", opts, err)
	}
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{testUUIDs[0]: "Healthy", testUUIDs[1]: "Healthy", testUUIDs[2]: "Healthy"}
	if got := healthOf(first.Devices); !mapsEqual(got, want) {
		t.Fatalf("first ListAndWatch = %v, want %v", got, want)
	}

	// A test marks GPU 1 unhealthy by rewriting the config: ListAndWatch sends again.
	writeJSON(t, configPath, testPluginConfig("envvar", "uuid", 1))
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want[testUUIDs[1]] = "Unhealthy"
	if got := healthOf(next.Devices); !mapsEqual(got, want) {
		t.Fatalf("ListAndWatch after the config change = %v, want %v", got, want)
	}

	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{testUUIDs[2], testUUIDs[0]}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != testUUIDs[2]+","+testUUIDs[0] {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q", got)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-unknown"}},
	}}); err == nil {
		t.Fatal("Allocate of an unknown device succeeded")
	}

	pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs:   []string{testUUIDs[2], testUUIDs[1], testUUIDs[0]},
			MustIncludeDeviceIDs: []string{testUUIDs[2]},
			AllocationSize:       2,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := pref.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{testUUIDs[2], testUUIDs[0]}) {
		t.Fatalf("GetPreferredAllocation = %v", got)
	}

	// A kubelet restart: it deletes the plugin sockets and makes a new kubelet.sock.
	kubelet.server.Stop()
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	kubelet = startFakeKubelet(t, pluginDir)
	if req := kubelet.expectRegister(t); req.Endpoint != "nvidia-gpu.sock" {
		t.Fatalf("RegisterRequest after the restart = %v", req)
	}
	if _, err := os.Stat(socket); err != nil {
		t.Fatalf("the plugin socket is not back: %v", err)
	}
	// The new socket serves: the device list is the current one.
	stream, err = dialPlugin(t, socket).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := stream.Recv(); err != nil || !mapsEqual(healthOf(again.Devices), want) {
		t.Fatalf("ListAndWatch after the restart = %v, %v", again, err)
	}

	// Only kubelet.sock is new (the plugin socket survived): it registers again.
	kubelet.server.Stop()
	kubelet = startFakeKubelet(t, pluginDir)
	kubelet.expectRegister(t)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runDevicePlugin = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not stop within 10s")
	}
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Fatalf("the plugin socket is still there after the stop: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestAllocateStrategies checks each device list strategy and ID strategy against NVIDIA's
// k8s-device-plugin v0.20.0 (internal/plugin/server.go, getAllocateResponse).
func TestAllocateStrategies(t *testing.T) {
	requested := []string{testUUIDs[2], testUUIDs[0]}
	const rid = "7e57a110-0000-4000-8000-000000000000"
	annotationKey := "cdi.k8s.io/nvidia-device-plugin_" + rid
	for _, tc := range []struct {
		strategy, ids string
		envs          map[string]string
		cdiDevices    []string
		annotations   map[string]string
	}{
		{"envvar", "uuid", map[string]string{"NVIDIA_VISIBLE_DEVICES": testUUIDs[2] + "," + testUUIDs[0]}, nil, nil},
		{"envvar", "index", map[string]string{"NVIDIA_VISIBLE_DEVICES": "2,0"}, nil, nil},
		{"cdi-cri", "uuid", map[string]string{}, []string{"nvidia.com/gpu=" + testUUIDs[2], "nvidia.com/gpu=" + testUUIDs[0]}, nil},
		{"cdi-cri", "index", map[string]string{}, []string{"nvidia.com/gpu=2", "nvidia.com/gpu=0"}, nil},
		{"cdi-annotations", "uuid", map[string]string{}, nil,
			map[string]string{annotationKey: "nvidia.com/gpu=" + testUUIDs[2] + ",nvidia.com/gpu=" + testUUIDs[0]}},
		{"cdi-annotations", "index", map[string]string{}, nil,
			map[string]string{annotationKey: "nvidia.com/gpu=2,nvidia.com/gpu=0"}},
		{"envvar,cdi-cri", "index", map[string]string{"NVIDIA_VISIBLE_DEVICES": "2,0"}, []string{"nvidia.com/gpu=2", "nvidia.com/gpu=0"}, nil},
	} {
		t.Run(tc.strategy+"/"+tc.ids, func(t *testing.T) {
			cfg := testPluginConfig(tc.strategy, tc.ids)
			if err := cfg.validate(); err != nil {
				t.Fatal(err)
			}
			resp, err := allocateResponse(&cfg, requested, rid)
			if err != nil {
				t.Fatal(err)
			}
			if !mapsEqual(resp.Envs, tc.envs) {
				t.Errorf("Envs = %v, want %v", resp.Envs, tc.envs)
			}
			var names []string
			for _, d := range resp.CdiDevices {
				names = append(names, d.Name)
			}
			if !slices.Equal(names, tc.cdiDevices) {
				t.Errorf("CdiDevices = %v, want %v", names, tc.cdiDevices)
			}
			if len(resp.Annotations)+len(tc.annotations) > 0 && !mapsEqual(resp.Annotations, tc.annotations) {
				t.Errorf("Annotations = %v, want %v", resp.Annotations, tc.annotations)
			}
			if len(resp.Mounts)+len(resp.Devices) > 0 {
				t.Errorf("Mounts %v, Devices %v: want none", resp.Mounts, resp.Devices)
			}
		})
	}
}

func TestPluginConfigValidation(t *testing.T) {
	for _, bad := range []string{
		`{"strategy": "volume-mounts"}`,
		`{"idStrategy": "name"}`,
		`{"devices": [{"index": 0, "uuid": "GPU-a"}, {"index": 0, "uuid": "GPU-b"}]}`,
		`{"devices": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-a"}]}`,
		`{"devices": [{"index": 0, "uuid": "GPU-a,GPU-b"}]}`,
		`{"resource": "gpu"}`,
		`{"devices": [], "extra": 1}`,
	} {
		path := filepath.Join(t.TempDir(), "c.json")
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := readConfig(path, new(pluginConfig)); err == nil {
			t.Errorf("config %s was accepted", bad)
		}
	}
}

// TestPluginCDISpec: the spec names each GPU by index and by UUID, plus "all"; a runtime
// (the CDI library containerd uses) injects the marker env and the device node.
func TestPluginCDISpec(t *testing.T) {
	dir := t.TempDir()
	cfg := testPluginConfig("cdi-cri", "uuid")
	p := &devicePlugin{cdiDir: dir, deviceNodes: true, cfg: &cfg}
	if err := p.writeCDISpec(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nvidia.com-gpu.json")); err != nil {
		t.Fatal(err)
	}
	names := listCDIDevices(t, dir)
	want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2", "nvidia.com/gpu=all"}
	for _, u := range testUUIDs {
		want = append(want, "nvidia.com/gpu="+u)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("CDI devices = %v, want %v", names, want)
	}

	oci := injectCDI(t, dir, "nvidia.com/gpu="+testUUIDs[1])
	if !slices.Contains(oci.Process.Env, "SIM_GPU_1="+testUUIDs[1]) {
		t.Errorf("env = %v", oci.Process.Env)
	}
	checkDeviceNodes(t, oci, "/dev/nvidia1")

	oci = injectCDI(t, dir, "nvidia.com/gpu=all")
	for i, u := range testUUIDs {
		if !slices.Contains(oci.Process.Env, markerEnv(i, u)) {
			t.Errorf("all: env = %v", oci.Process.Env)
		}
	}
	checkDeviceNodes(t, oci, "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2")

	// No device nodes when they are turned off.
	p.deviceNodes = false
	if err := p.writeCDISpec(); err != nil {
		t.Fatal(err)
	}
	if oci := injectCDI(t, dir, "nvidia.com/gpu=0"); oci.Linux != nil && len(oci.Linux.Devices) > 0 {
		t.Errorf("device nodes with --device-nodes=false: %v", oci.Linux.Devices)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "nvidia.com-gpu.json"))
	if !strings.Contains(string(data), `"cdiVersion": "0.6.0"`) {
		t.Errorf("spec = %s", data)
	}
}
