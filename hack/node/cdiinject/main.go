// cdiinject is an NRI plugin for the real-node tests: it gives each container the CDI
// devices its pod names in the annotation family NRI's device-injector reads for CDI,
// cdi-devices.noderesource.dev (the container's key first, then the pod's), so SDG's
// delivery "cdi" can be seen reaching a container on a containerd node without GPUs.
// (The device-injector itself is published in no Go module this machine can fetch.)
//
//	cdiinject -socket /var/run/nri/nri.sock
//
// The annotation value is a JSON list of qualified CDI names, as SDG writes it:
// ["nvidia.com/gpu=GPU-…"]. containerd resolves the names against its cdi_spec_dirs.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

const family = "cdi-devices.noderesource.dev"

type plugin struct{}

// devices is the CDI names for container ctr of pod: its own key, else the pod's.
func devices(annotations map[string]string, ctr string) ([]string, error) {
	for _, key := range []string{family + "/container." + ctr, family + "/pod"} {
		value, ok := annotations[key]
		if !ok {
			continue
		}
		var names []string
		if err := json.Unmarshal([]byte(value), &names); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", key, err)
		}
		return names, nil
	}
	return nil, nil
}

func (p *plugin) CreateContainer(
	_ context.Context, pod *api.PodSandbox, ctr *api.Container,
) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	names, err := devices(pod.GetAnnotations(), ctr.GetName())
	if err != nil {
		return nil, nil, err
	}
	adjust := &api.ContainerAdjustment{}
	for _, name := range names {
		if name = strings.TrimSpace(name); name != "" {
			adjust.AddCDIDevice(&api.CDIDevice{Name: name})
		}
	}
	if len(names) > 0 {
		log.Printf("%s/%s container %s: CDI devices %v", pod.GetNamespace(), pod.GetName(), ctr.GetName(), names)
	}
	return adjust, nil, nil
}

// Synchronize is called once the plugin is registered: the line tests wait for.
func (p *plugin) Synchronize(
	_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container,
) ([]*api.ContainerUpdate, error) {
	log.Printf("synchronized: %d pods, %d containers", len(pods), len(ctrs))
	return nil, nil
}

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "containerd's NRI socket")
	flag.Parse()
	s, err := stub.New(&plugin{}, stub.WithPluginName("cdiinject"), stub.WithPluginIdx("50"),
		stub.WithSocketPath(*socket))
	if err != nil {
		log.Fatalf("cdiinject: %v", err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Printf("cdiinject: %v", err)
		os.Exit(1)
	}
}
