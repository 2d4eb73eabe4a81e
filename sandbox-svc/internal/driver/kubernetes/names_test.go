package kubernetes

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestPodNameIsADNSLabel(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"sb-1a2b3c", "SB-Upper", "with.dots_and_underscores", strings.Repeat("x", 128), "-lead", "sb-1a2b3C"} {
		n := podName(id)
		if len(n) > 63 || !dnsLabel.MatchString(n) {
			t.Errorf("podName(%q) = %q, not a DNS label", id, n)
		}
		if other, dup := seen[n]; dup {
			t.Errorf("podName(%q) = podName(%q) = %q", id, other, n)
		}
		seen[n] = id
	}
	if podName("sb-1a2b3c") != "hangar-sb-1a2b3c" {
		t.Errorf("a valid id changes: %q", podName("sb-1a2b3c"))
	}
}

func TestLabelValue(t *testing.T) {
	valid := regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	for _, s := range []string{"web", "web app", strings.Repeat("e", 80), "ünïcode", "a/b"} {
		v := labelValue(s)
		if len(v) > 63 || !valid.MatchString(v) {
			t.Errorf("labelValue(%q) = %q", s, v)
		}
	}
	if labelValue("web") != "web" || labelValue("web app") == labelValue("web-app") {
		t.Error("labelValue must keep valid values and tell changed ones apart")
	}
}

func TestFileInfoOfToolStatus(t *testing.T) {
	fi, err := info(&sandboxtool.FileStatus{Mode: 0o100644, Size: 7, MTime: 1700000000}, "dir/new.txt")
	if err != nil || fi.Mode != 0o644 || fi.Size != 7 || fi.ModTime.Unix() != 1700000000 || fi.Path != "dir/new.txt" {
		t.Errorf("regular file: %+v %v", fi, err)
	}
	fi, err = info(&sandboxtool.FileStatus{Mode: 0o120777, Size: 4, MTime: 1700000000, Link: "/etc"}, "etc-link")
	if err != nil || fi.Mode&fs.ModeSymlink == 0 || fi.LinkTarget != "/etc" {
		t.Errorf("symlink: %+v %v", fi, err)
	}
	fi, _ = info(&sandboxtool.FileStatus{Mode: 0o40755, Size: 4096, MTime: 1}, "d")
	if !fi.Mode.IsDir() || fi.Mode.Perm() != 0o755 {
		t.Errorf("dir: %v", fi.Mode)
	}
	if _, err := info(nil, "x"); err == nil {
		t.Error("no status accepted")
	}
}

func TestGatewayHostPort(t *testing.T) {
	if ip, port, ok := gatewayHostPort("10.0.0.7:7404"); !ok || ip.String() != "10.0.0.7" || port != 7404 {
		t.Errorf("ip:port = %v %d %v", ip, port, ok)
	}
	for _, bad := range []string{"gateway:7404", "10.0.0.7", "10.0.0.7:0", ""} {
		if _, _, ok := gatewayHostPort(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestAdvisoryWarningIsNotTheFailure: a node without cluster DNS records
// MissingClusterDNS for every pod before its pull fails; the wait for the
// failure's own event must not stop at it.
func TestAdvisoryWarningIsNotTheFailure(t *testing.T) {
	warn := func(reason string) corev1.Event { return corev1.Event{Type: corev1.EventTypeWarning, Reason: reason} }
	normal := corev1.Event{Type: corev1.EventTypeNormal, Reason: "Pulling"}
	if hasWarning([]corev1.Event{normal, warn("MissingClusterDNS")}) {
		t.Error("MissingClusterDNS alone counted as the failure's warning")
	}
	if !hasWarning([]corev1.Event{warn("MissingClusterDNS"), normal, warn("Failed")}) {
		t.Error("the pull's Failed event after MissingClusterDNS was not seen")
	}
}

// TestLastEventSkipsAdvisoryWarnings: MissingClusterDNS, recorded again at
// each sync, is not what a pod that never got ready was doing.
func TestLastEventSkipsAdvisoryWarnings(t *testing.T) {
	at := func(sec int64) metav1.Time { return metav1.Unix(sec, 0) }
	items := []corev1.Event{
		{Type: corev1.EventTypeNormal, Reason: "Pulling", Message: "Pulling image", LastTimestamp: at(2)},
		{Type: corev1.EventTypeWarning, Reason: "MissingClusterDNS", Message: "no cluster DNS", LastTimestamp: at(3)},
	}
	if got := lastEvent(items, &corev1.Pod{}); got != "Pulling: Pulling image" {
		t.Errorf("lastEvent = %q, want the pull", got)
	}
}
