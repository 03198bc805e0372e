package main

import "testing"

func TestDevicesContainerKeyWinsOverPodKey(t *testing.T) {
	annotations := map[string]string{
		family + "/container.probe": `["nvidia.com/gpu=GPU-a"]`,
		family + "/pod":             `["nvidia.com/gpu=all"]`,
	}
	got, err := devices(annotations, "probe")
	if err != nil || len(got) != 1 || got[0] != "nvidia.com/gpu=GPU-a" {
		t.Fatalf("container key: got %v, %v", got, err)
	}
	got, err = devices(annotations, "sidecar")
	if err != nil || len(got) != 1 || got[0] != "nvidia.com/gpu=all" {
		t.Fatalf("pod key: got %v, %v", got, err)
	}
	if got, err := devices(map[string]string{}, "probe"); err != nil || got != nil {
		t.Fatalf("no annotation: got %v, %v", got, err)
	}
}

func TestDevicesRefusesAValueThatIsNoJSONList(t *testing.T) {
	if _, err := devices(map[string]string{family + "/pod": "nvidia.com/gpu=0"}, "c"); err == nil {
		t.Fatal("a bare name was accepted; SDG writes a JSON list")
	}
}
