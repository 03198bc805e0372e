// Command gpusim simulates NVIDIA GPUs behind the kubelet's real interfaces, for a real
// kubelet on a machine without GPUs (hack/node/simulators.py starts it):
//
//	gpusim device-plugin --config FILE [--plugin-dir DIR] [--cdi-dir DIR]
//	gpusim dra --kubeconfig FILE --node-name NODE --config FILE [--kubelet-root-dir DIR] [--cdi-dir DIR]
//
// device-plugin is a kubelet device plugin (API deviceplugin/v1beta1) in the manner of
// NVIDIA's k8s-device-plugin; dra is a DRA kubelet plugin publishing ResourceSlices in the
// shape of NVIDIA's DRA driver (driver gpu.nvidia.com). Both re-read their JSON config when
// it changes, so a test can mark a GPU unhealthy, and both exit cleanly on SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

const usage = `usage: gpusim <command> [flags]

commands:
  device-plugin   a kubelet device plugin for nvidia.com/gpu (Register on kubelet.sock)
  dra             a DRA kubelet plugin for gpu.nvidia.com (ResourceSlices, Prepare/Unprepare)

"gpusim <command> -h" lists the command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	var err error
	switch os.Args[1] {
	case "device-plugin":
		err = runDevicePlugin(ctx, os.Args[2:])
	case "dra":
		err = runDRA(ctx, os.Args[2:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "gpusim: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	klog.Flush()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpusim %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// newFlagSet is a flag set for one command, with klog's flags (-v and friends) on it.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("gpusim "+name, flag.ContinueOnError)
	klog.InitFlags(fs)
	return fs
}
