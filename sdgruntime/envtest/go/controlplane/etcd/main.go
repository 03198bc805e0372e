// Command etcd runs a single-member embedded etcd for local test control planes.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for etcd data (required)")
	clientURL := flag.String("listen-client-url", "http://127.0.0.1:2379", "client URL")
	peerURL := flag.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatalf("bad --listen-client-url: %v", err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatalf("bad --listen-peer-url: %v", err)
	}

	cfg := embed.NewConfig()
	cfg.Name = "sdg-envtest"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	// A test store: no fsync per write, small WAL, quiet logs.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		log.Fatal("etcd did not become ready within 60s")
	}
	log.Printf("etcd ready on %s", cu.String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Printf("etcd error: %v", err)
	}
	e.Close()
}
