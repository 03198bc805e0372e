package main

// The device plugin follows NVIDIA's k8s-device-plugin v0.20.0, internal/plugin/server.go:
// its socket is "nvidia-<name>.sock" in the plugin dir (getPluginSocketPath); it registers
// with GetPreferredAllocationAvailable; the devices it advertises have the GPU UUIDs as IDs;
// Allocate maps the requested UUIDs to the IDs of --device-id-strategy (uuid or index,
// uniqueDeviceIDsFromAnnotatedDeviceIDs) and answers per --device-list-strategy
// (getAllocateResponse): envvar sets NVIDIA_VISIBLE_DEVICES=<ids>; cdi-cri returns CDI
// devices "nvidia.com/gpu=<id>"; cdi-annotations returns the CDI annotation
// "cdi.k8s.io/nvidia-device-plugin_<response uuid>: nvidia.com/gpu=<id>,..."
// (getCDIDeviceAnnotations); with only CDI strategies no env is set. Its CDI spec
// (internal/cdi/cdi.go, CreateSpecFile) is <cdi-root>/nvidia.com-gpu.json.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// cdiAnnotationPlugin is the plugin name in the CDI annotation key, as NVIDIA's plugin
// passes it to cdiapi.UpdateAnnotations.
const cdiAnnotationPlugin = "nvidia-device-plugin"

// devicePlugin serves one resource's DevicePlugin gRPC service.
type devicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	socket        string // our socket, in the plugin dir
	kubeletSocket string
	cdiDir        string // "" writes no CDI spec
	deviceNodes   bool

	mu      sync.Mutex
	cfg     *pluginConfig
	changed chan struct{} // closed (and replaced) whenever cfg changes
}

func runDevicePlugin(ctx context.Context, args []string) error {
	fs := newFlagSet("device-plugin")
	configPath := fs.String("config", "", "the JSON config file (required; re-read when it changes)")
	pluginDir := fs.String("plugin-dir", pluginapi.DevicePluginPath,
		"the kubelet's device plugin directory: kubelet.sock is there, and this plugin's socket goes there")
	cdiDir := fs.String("cdi-dir", "/var/run/cdi", "where to write the CDI spec of kind <resource> (empty: none)")
	deviceNodes := fs.Bool("device-nodes", true,
		"CDI specs give each GPU a device node /dev/nvidia<index> (a char device from /dev/null)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *configPath == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("--config is required and there are no arguments")
	}
	cfg := new(pluginConfig)
	if err := readConfig(*configPath, cfg); err != nil {
		return err
	}
	_, name := splitResource(cfg.Resource)
	p := &devicePlugin{
		socket:        filepath.Join(*pluginDir, "nvidia-"+name+".sock"),
		kubeletSocket: filepath.Join(*pluginDir, "kubelet.sock"),
		cdiDir:        *cdiDir,
		deviceNodes:   *deviceNodes,
		cfg:           cfg,
		changed:       make(chan struct{}),
	}
	watch := &configWatch[pluginConfig, *pluginConfig]{path: *configPath}
	watch.last, _ = stampOf(*configPath)
	if err := p.writeCDISpec(); err != nil {
		return err
	}
	if err := os.MkdirAll(*pluginDir, 0o755); err != nil {
		return err
	}
	return p.run(ctx, watch)
}

// run serves until ctx ends. Every poll it reloads the config, and (re)starts serving and
// registers again when its socket vanished (the kubelet deletes every plugin socket when
// it starts) or kubelet.sock is a new one (a restarted kubelet).
func (p *devicePlugin) run(ctx context.Context, watch *configWatch[pluginConfig, *pluginConfig]) error {
	var (
		server     *grpc.Server
		registered fileStamp // the kubelet.sock we registered with
		isReg      bool
		lastErr    string
	)
	stopServer := func() {
		if server != nil {
			server.Stop()
			server = nil
		}
	}
	defer func() {
		stopServer()
		if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
			klog.ErrorS(err, "removing the plugin socket")
		}
		klog.InfoS("stopped", "socket", p.socket)
	}()
	logOnce := func(err error, msg string) {
		if err.Error() != lastErr {
			klog.ErrorS(err, msg)
			lastErr = err.Error()
		}
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if cfg, ok, err := watch.load(); err != nil {
			logOnce(err, "config not reloaded; keeping the last one")
		} else if ok {
			p.update(cfg)
		}

		if _, ok := stampOf(p.socket); !ok || server == nil {
			stopServer()
			var err error
			if server, err = p.serve(); err != nil {
				return err
			}
			isReg = false
			klog.InfoS("serving", "socket", p.socket)
		}

		if kubelet, ok := stampOf(p.kubeletSocket); !ok {
			isReg = false
		} else if !isReg || kubelet != registered {
			if err := p.register(ctx); err != nil {
				logOnce(err, "registering with the kubelet (retrying)")
			} else {
				isReg, registered, lastErr = true, kubelet, ""
				klog.InfoS("registered with the kubelet", "resource", p.config().Resource,
					"kubeletSocket", p.kubeletSocket)
			}
		}

		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// serve listens on the plugin socket (replacing a stale one) and serves in the background.
func (p *devicePlugin) serve() (*grpc.Server, error) {
	if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	listener, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(listener); err != nil {
			klog.ErrorS(err, "gRPC server ended")
		}
	}()
	return server, nil
}

func (p *devicePlugin) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+p.kubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.config().Resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

func (p *devicePlugin) config() *pluginConfig {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// update takes a new config: ListAndWatch streams send the new device list, and the CDI
// spec is rewritten. A new resource name needs a restart (the kubelet knows us by it).
func (p *devicePlugin) update(cfg *pluginConfig) {
	p.mu.Lock()
	if cfg.Resource != p.cfg.Resource {
		klog.InfoS("config names another resource; that needs a restart, keeping the old name",
			"resource", p.cfg.Resource, "new", cfg.Resource)
		cfg.Resource = p.cfg.Resource
	}
	p.cfg = cfg
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	klog.InfoS("config reloaded", "devices", describeDevices(cfg))
	if err := p.writeCDISpec(); err != nil {
		klog.ErrorS(err, "rewriting the CDI spec")
	}
}

func describeDevices(cfg *pluginConfig) string {
	var parts []string
	for _, d := range cfg.Devices {
		health := pluginapi.Healthy
		if !d.healthy() {
			health = pluginapi.Unhealthy
		}
		parts = append(parts, fmt.Sprintf("%d=%s:%s", d.Index, d.UUID, health))
	}
	return strings.Join(parts, ",")
}

// apiDevices is the device list for ListAndWatch: the UUIDs are the IDs.
func apiDevices(cfg *pluginConfig) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(cfg.Devices))
	for _, d := range cfg.Devices {
		health := pluginapi.Healthy
		if !d.healthy() {
			health = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: d.UUID, Health: health})
	}
	return out
}

func (p *devicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the device list, then again each time the config changes.
func (p *devicePlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devices, changed := apiDevices(p.cfg), p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation prefers the devices that must be included, then the lowest
// indices.
func (p *devicePlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	cfg := p.config()
	order := map[string]int{}
	for _, d := range cfg.Devices {
		order[d.UUID] = d.Index
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, creq := range req.ContainerRequests {
		chosen := slices.Clone(creq.MustIncludeDeviceIDs)
		rest := slices.DeleteFunc(slices.Clone(creq.AvailableDeviceIDs), func(id string) bool {
			return slices.Contains(chosen, id)
		})
		slices.SortStableFunc(rest, func(a, b string) int { return order[a] - order[b] })
		for _, id := range rest {
			if len(chosen) >= int(creq.AllocationSize) {
				break
			}
			chosen = append(chosen, id)
		}
		resp.ContainerResponses = append(resp.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return resp, nil
}

// Allocate answers for each container per the device list and ID strategies.
func (p *devicePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	cfg := p.config()
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.ContainerRequests {
		cresp, err := allocateResponse(cfg, creq.DevicesIds, uuid.NewString())
		if err != nil {
			return nil, fmt.Errorf("invalid allocation request for %q: %w", cfg.Resource, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// allocateResponse is one container's answer; responseID names its CDI annotation.
func allocateResponse(cfg *pluginConfig, requested []string, responseID string) (*pluginapi.ContainerAllocateResponse, error) {
	byUUID := map[string]pluginDevice{}
	for _, d := range cfg.Devices {
		byUUID[d.UUID] = d
	}
	var ids []string
	for _, id := range requested {
		d, ok := byUUID[id]
		if !ok {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		if cfg.IDStrategy == idStrategyIndex {
			id = strconv.Itoa(d.Index)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	strategies := cfg.strategies()
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	vendor, class := splitResource(cfg.Resource)
	var cdiDevices []string
	for _, id := range ids {
		cdiDevices = append(cdiDevices, cdiparser.QualifiedName(vendor, class, id))
	}
	if strategies[strategyCDIAnnotations] && len(cdiDevices) > 0 {
		annotations, err := cdiapi.UpdateAnnotations(map[string]string{}, cdiAnnotationPlugin, responseID, cdiDevices)
		if err != nil {
			return nil, fmt.Errorf("CDI annotations: %w", err)
		}
		resp.Annotations = annotations
	}
	if strategies[strategyCDICRI] {
		for _, name := range cdiDevices {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: name})
		}
	}
	if strategies[strategyEnvVar] {
		resp.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(ids, ",")
	}
	return resp, nil
}

func (p *devicePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// writeCDISpec writes the spec of kind <resource> with a device per index, per UUID and
// "all", the names `nvidia-ctk cdi generate --device-name-strategy=index,uuid` gives.
func (p *devicePlugin) writeCDISpec() error {
	if p.cdiDir == "" {
		return nil
	}
	cfg := p.config()
	name := cdiapi.GenerateSpecName(splitResource(cfg.Resource))
	if len(cfg.Devices) == 0 {
		return removeSpec(p.cdiDir, name) // a CDI spec must have a device
	}
	path, err := writeSpec(p.cdiDir, name, pluginCDISpec(cfg, p.deviceNodes))
	if err == nil {
		klog.V(2).InfoS("wrote the CDI spec", "path", path)
	}
	return err
}

func pluginCDISpec(cfg *pluginConfig, nodes bool) *cdispec.Spec {
	spec := &cdispec.Spec{Kind: cfg.Resource}
	var all []cdispec.ContainerEdits
	for _, d := range cfg.Devices {
		edits := deviceEdits(d.Index, d.UUID, nodes)
		all = append(all, edits)
		spec.Devices = append(spec.Devices,
			cdispec.Device{Name: strconv.Itoa(d.Index), ContainerEdits: edits},
			cdispec.Device{Name: d.UUID, ContainerEdits: deviceEdits(d.Index, d.UUID, nodes)})
	}
	spec.Devices = append(spec.Devices, cdispec.Device{Name: "all", ContainerEdits: mergeEdits(all...)})
	return spec
}
