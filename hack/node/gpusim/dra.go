package main

// The DRA plugin mirrors NVIDIA's DRA driver, kubernetes-sigs/dra-driver-nvidia-gpu
// (formerly NVIDIA/k8s-dra-driver-gpu), release v25.12.0 (commit 0882da87):
//
//   - cmd/gpu-kubelet-plugin/deviceinfo.go (GpuInfo.CanonicalName, GetDevice) and
//     partitions.go (PartDevAttributes): a full GPU is device "gpu-<minor>" with the
//     attributes type="gpu", uuid, productName, brand, architecture, the version-typed
//     cudaComputeCapability, driverVersion and cudaDriverVersion (semver-normalised, "8.0"
//     -> "8.0.0"), resource.kubernetes.io/pciBusID, and resource.kubernetes.io/pcieRoot when
//     sysfs resolves it; capacity "memory" in bytes. No index, no minor.
//   - driver.go (publishResources): one pool named after the node, one slice with every GPU;
//     kubeletplugin.Start with RegistrarDirectoryPath and PluginDataDirectoryPath
//     (<kubelet plugins dir>/gpu.nvidia.com).
//   - cdi.go: the CDI kind is k8s.gpu.nvidia.com/claim; each prepared device is
//     "<claim UID>-gpu-<minor>" (GetClaimDeviceName) in one transient spec per claim, named by
//     cdiapi.GenerateTransientSpecName (the driver writes YAML; this writes JSON).
//   - device_state.go (prepareDevices): one kubeletplugin.Device per allocation result of
//     this driver, with that result's request, pool and device name.
//
// Unhealthy GPUs: v25.12.0 leaves them out of the ResourceSlice (driver.go,
// deviceHealthEvents, behind its NVMLDeviceHealthCheck gate); its main branch (commit
// 95932046, August 2026) publishes them with a DRA device taint instead
// (device_health.go: gpu.nvidia.com/xid=<xid> with effect NoSchedule for a critical XID,
// gpu.nvidia.com/gpu-lost:NoSchedule). This does what main does by default, as a critical
// XID 79 ("fallen off the bus"); config "unhealthy": "omit" does what v25.12.0 does.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	draDriverName = "gpu.nvidia.com"
	cdiClaimKind  = "k8s." + draDriverName + "/claim"
	// unhealthyTaintKey and unhealthyXID: the taint main's driver sets for a critical XID.
	unhealthyTaintKey = draDriverName + "/xid"
	unhealthyXID      = "79"
)

// draPlugin implements kubeletplugin.DRAPlugin for the simulated GPUs.
type draPlugin struct {
	nodeName    string
	cdiDir      string
	deviceNodes bool
	helper      *kubeletplugin.Helper

	mu      sync.Mutex
	cfg     *draConfig
	changed chan struct{} // closed (and replaced) whenever cfg changes
}

func runDRA(ctx context.Context, args []string) error {
	fs := newFlagSet("dra")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server (empty: in-cluster)")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "the Node this plugin serves (required; the pool name)")
	configPath := fs.String("config", "", "the JSON config file (required; re-read when it changes)")
	rootDir := fs.String("kubelet-root-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	registrarDir := fs.String("kubelet-registrar-directory-path", "",
		"where the kubelet looks for plugin registration sockets (default <kubelet-root-dir>/plugins_registry)")
	pluginsDir := fs.String("kubelet-plugins-directory-path", "",
		"the parent of this plugin's data directory (default <kubelet-root-dir>/plugins)")
	cdiDir := fs.String("cdi-dir", "/var/run/cdi", "where to write the claims' CDI specs")
	deviceNodes := fs.Bool("device-nodes", true,
		"CDI specs give each GPU a device node /dev/nvidia<minor> (a char device from /dev/null)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodeName == "" || *configPath == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("--node-name and --config are required and there are no arguments")
	}
	if *registrarDir == "" {
		*registrarDir = filepath.Join(*rootDir, "plugins_registry")
	}
	if *pluginsDir == "" {
		*pluginsDir = filepath.Join(*rootDir, "plugins")
	}
	dataDir := filepath.Join(*pluginsDir, draDriverName)

	cfg := new(draConfig)
	if err := readConfig(*configPath, cfg); err != nil {
		return err
	}
	watch := &configWatch[draConfig, *draConfig]{path: *configPath}
	watch.last, _ = stampOf(*configPath)

	restConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: *kubeconfig}, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restConfig.UserAgent = "gpusim-dra"
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	// The helper wants both directories to exist; the kubelet makes them too, in its time.
	for _, dir := range []string{*registrarDir, dataDir, *cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	p := &draPlugin{
		nodeName:    *nodeName,
		cdiDir:      *cdiDir,
		deviceNodes: *deviceNodes,
		cfg:         cfg,
		changed:     make(chan struct{}),
	}
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.DriverName(draDriverName),
		kubeletplugin.RegistrarDirectoryPath(*registrarDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	p.helper = helper
	defer func() {
		helper.Stop() // closes (and removes) the registration and DRA sockets
		klog.InfoS("stopped")
	}()
	klog.InfoS("serving", "driver", draDriverName, "node", *nodeName,
		"registrar", filepath.Join(*registrarDir, draDriverName+"-reg.sock"),
		"plugin", filepath.Join(dataDir, "dra.sock"))

	// Publishing needs the API server and the Node, not the kubelet: the ResourceSlice
	// controller writes the slices whether or not the kubelet has registered the plugin.
	if err := helper.PublishResources(ctx, driverResources(*nodeName, cfg)); err != nil {
		return err
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		cfg, ok, err := watch.load()
		if err != nil {
			if err.Error() != lastErr {
				klog.ErrorS(err, "config not reloaded; keeping the last one")
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		if ok {
			p.update(cfg)
			if err := helper.PublishResources(ctx, driverResources(*nodeName, cfg)); err != nil {
				return err
			}
		}
	}
}

func (p *draPlugin) config() *draConfig {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

func (p *draPlugin) update(cfg *draConfig) {
	p.mu.Lock()
	p.cfg = cfg
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	var parts []string
	for _, g := range cfg.GPUs {
		parts = append(parts, fmt.Sprintf("gpu-%d=%s:healthy=%t", g.Minor, g.UUID, g.healthy()))
	}
	klog.InfoS("config reloaded; republishing", "gpus", strings.Join(parts, ","))
}

// deviceName is the NVIDIA driver's canonical name of a full GPU.
func deviceName(minor int) string { return fmt.Sprintf("gpu-%d", minor) }

// driverResources is the one pool (named after the node) with one slice of every GPU.
func driverResources(nodeName string, cfg *draConfig) resourceslice.DriverResources {
	gpus := slices.Clone(cfg.GPUs)
	slices.SortFunc(gpus, func(a, b draGPU) int { return a.Minor - b.Minor })
	var slice resourceslice.Slice
	for _, g := range gpus {
		if !g.healthy() && cfg.Unhealthy == "omit" {
			continue
		}
		slice.Devices = append(slice.Devices, gpuDevice(g))
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: []resourceslice.Slice{slice}}},
	}
}

// gpuDevice is one GPU as the NVIDIA driver announces it.
func gpuDevice(g draGPU) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	ver := func(s string) resourceapi.DeviceAttribute {
		v := semverOf(s)
		return resourceapi.DeviceAttribute{VersionValue: &v}
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":                  str("gpu"),
		"uuid":                  str(g.UUID),
		"productName":           str(g.ProductName),
		"brand":                 str(g.Brand),
		"architecture":          str(g.Architecture),
		"cudaComputeCapability": ver(g.CUDAComputeCapability),
		"driverVersion":         ver(g.DriverVersion),
		"cudaDriverVersion":     ver(g.CUDADriverVersion),
		deviceattribute.StandardDeviceAttributePCIBusID: str(g.PCIBusID),
	}
	if g.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(g.PCIeRoot)
	}
	device := resourceapi.Device{
		Name:       deviceName(g.Minor),
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(g.MemoryBytes, resource.BinarySI)},
		},
	}
	if !g.healthy() {
		device.Taints = []resourceapi.DeviceTaint{{
			Key:    unhealthyTaintKey,
			Value:  unhealthyXID,
			Effect: resourceapi.DeviceTaintEffectNoSchedule,
		}}
	}
	return device
}

// semverOf normalises "8.0" or "550.54.15" to a full semantic version ("8.0.0",
// "550.54.15"), as the driver does with semver.MustParse(...).String(). A version that
// does not parse is passed on as it is (the API server will then refuse the slice, which
// the plugin logs).
func semverOf(s string) string {
	v, err := version.ParseGeneric(s)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%d.%d.%d", v.Major(), v.Minor(), v.Patch())
}

// claimSpecName is the file name (without .json) of a claim's CDI spec.
func claimSpecName(claimUID types.UID) string {
	vendor, class := cdiparser.ParseQualifier(cdiClaimKind)
	return cdiapi.GenerateTransientSpecName(vendor, class, string(claimUID))
}

// claimDeviceName is a prepared GPU's name in its claim's spec: "<claim UID>-gpu-<minor>".
func claimDeviceName(claimUID types.UID, minor int) string {
	return fmt.Sprintf("%s-%s", claimUID, deviceName(minor))
}

func (p *draPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := map[types.UID]kubeletplugin.PrepareResult{}
	cfg := p.config()
	for _, claim := range claims {
		devices, err := p.prepare(cfg, claim)
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
		if err != nil {
			klog.ErrorS(err, "prepare failed", "claim", klog.KObj(claim), "uid", claim.UID)
		} else {
			klog.InfoS("prepared", "claim", klog.KObj(claim), "uid", claim.UID, "devices", len(devices))
		}
	}
	return results, nil
}

// prepare writes the claim's CDI spec (again, if it is there: preparing is idempotent) and
// returns its devices.
func (p *draPlugin) prepare(cfg *draConfig, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	byName := map[string]draGPU{}
	for _, g := range cfg.GPUs {
		byName[deviceName(g.Minor)] = g
	}
	var (
		devices []kubeletplugin.Device
		uuids   []string
		spec    = &cdispec.Spec{Kind: cdiClaimKind}
	)
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != draDriverName {
			continue
		}
		if result.Pool != p.nodeName {
			return nil, fmt.Errorf("device %s is in pool %q, not this node's (%q)", result.Device, result.Pool, p.nodeName)
		}
		g, ok := byName[result.Device]
		if !ok {
			return nil, fmt.Errorf("device %s is not a GPU of this node", result.Device)
		}
		name := claimDeviceName(claim.UID, g.Minor)
		vendor, class := cdiparser.ParseQualifier(cdiClaimKind)
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           name,
			ContainerEdits: deviceEdits(g.Minor, g.UUID, p.deviceNodes),
		})
		if !slices.Contains(uuids, g.UUID) {
			uuids = append(uuids, g.UUID)
		}
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{result.Request},
			PoolName:     result.Pool,
			DeviceName:   result.Device,
			CDIDeviceIDs: []string{cdiparser.QualifiedName(vendor, class, name)},
		})
	}
	if len(devices) == 0 {
		return nil, nil
	}
	// The claim-wide edits: every GPU of the claim in NVIDIA_VISIBLE_DEVICES.
	spec.ContainerEdits.Env = []string{"NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ",")}
	if _, err := writeSpec(p.cdiDir, claimSpecName(claim.UID), spec); err != nil {
		return nil, fmt.Errorf("writing the CDI spec: %w", err)
	}
	return devices, nil
}

func (p *draPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := map[types.UID]error{}
	for _, claim := range claims {
		results[claim.UID] = removeSpec(p.cdiDir, claimSpecName(claim.UID))
		klog.InfoS("unprepared", "claim", claim.String(), "uid", claim.UID)
	}
	return results, nil
}

func (p *draPlugin) HandleError(ctx context.Context, err error, msg string) {
	// As the helper's documentation advises: log; errors of publishing are all recoverable.
	runtime.HandleErrorWithContext(ctx, err, msg)
}

// WatchHealthStatus reports each published GPU's health to the kubelet, again when the
// config changes and every 10 s (the kubelet forgets a report after 30 s).
func (p *draPlugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := time.NewTicker(10 * time.Second)
	defer ticker.Stop()
	for {
		p.mu.Lock()
		cfg, changed := p.cfg, p.changed
		p.mu.Unlock()
		report := kubeletplugin.DeviceHealthReport{}
		for _, g := range cfg.GPUs {
			health := kubeletplugin.HealthStatusHealthy
			if !g.healthy() {
				health = kubeletplugin.HealthStatusUnhealthy
			}
			report.Devices = append(report.Devices, kubeletplugin.DeviceHealth{
				PoolName:    p.nodeName,
				DeviceName:  deviceName(g.Minor),
				Health:      health,
				LastUpdated: time.Now(),
			})
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}
