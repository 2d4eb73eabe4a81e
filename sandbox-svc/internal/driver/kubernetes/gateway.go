package kubernetes

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// gatewayRoute is how a sandbox pod reaches the model gateway: the
// address its HANGAR_GATEWAY_ADDR names and the egress rule a policy of
// egress none allows.
type gatewayRoute struct {
	addr string
	rule networkingv1.NetworkPolicyEgressRule
}

// serviceName is the Service and namespace a gateway host names
// (`name`, `name.namespace` or `name.namespace.svc[.cluster.domain]`),
// ns when it names none.
func serviceName(host, ns string) (name, namespace string, ok bool) {
	parts := strings.Split(host, ".")
	switch {
	case host == "":
		return "", "", false
	case len(parts) == 1:
		return parts[0], ns, parts[0] != ""
	case len(parts) == 2 || parts[2] == "svc":
		return parts[0], parts[1], parts[0] != "" && parts[1] != ""
	}
	return "", "", false
}

// gateway resolves Options.Gateway once: an IP:port is used as it is; a
// host naming a Service of the cluster (the deployment's `gateway-svc:7404`)
// is its cluster IP and port (a pod with egress none has no DNS), with an
// egress rule to the Service's pods on their target port (a policy applies
// after the cluster IP is translated to a pod's).
func (d *Driver) gateway(ctx context.Context) (gatewayRoute, error) {
	d.mu.Lock()
	cached := d.route
	d.mu.Unlock()
	if cached != nil {
		return *cached, nil
	}
	gw := d.opts.Gateway
	if gw == "" {
		return gatewayRoute{}, nil
	}
	tcp := corev1.ProtocolTCP
	var route gatewayRoute
	if ip, port, ok := gatewayHostPort(gw); ok {
		bits := 32
		if ip.To4() == nil {
			bits = 128
		}
		p := intstr.FromInt32(port)
		route = gatewayRoute{addr: gw, rule: networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("%s/%d", ip, bits)}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}},
		}}
	} else {
		host, portText, err := net.SplitHostPort(gw)
		port, perr := strconv.Atoi(portText)
		name, ns, ok := serviceName(host, d.opts.Namespace)
		if err != nil || perr != nil || !ok {
			return gatewayRoute{}, fmt.Errorf("%w: the gateway address %q is neither an IP:port nor a Service's name:port", driver.ErrEgressUnsupported, gw)
		}
		svc, err := d.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return gatewayRoute{}, fmt.Errorf("%w: the gateway %q: Service %s/%s: %w", driver.ErrEgressUnsupported, gw, ns, name, d.mapErr(err))
		}
		var sp *corev1.ServicePort
		for i := range svc.Spec.Ports {
			if int(svc.Spec.Ports[i].Port) == port {
				sp = &svc.Spec.Ports[i]
			}
		}
		ip := net.ParseIP(svc.Spec.ClusterIP)
		if sp == nil || ip == nil || len(svc.Spec.Selector) == 0 {
			return gatewayRoute{}, fmt.Errorf("%w: the gateway Service %s/%s needs a cluster IP, a selector and port %d", driver.ErrEgressUnsupported, ns, name, port)
		}
		target := sp.TargetPort
		if target.Type == intstr.Int && target.IntValue() == 0 {
			target = intstr.FromInt32(sp.Port)
		}
		peer := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}}
		if ns != d.opts.Namespace {
			peer.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
		}
		route = gatewayRoute{addr: net.JoinHostPort(ip.String(), portText), rule: networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{peer},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &target}},
		}}
	}
	d.mu.Lock()
	d.route = &route
	d.mu.Unlock()
	return route, nil
}

// gatewayAddr is what a sandbox's HANGAR_GATEWAY_ADDR says: the resolved
// address once a create resolved it, else the setting.
func (d *Driver) gatewayAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.route != nil {
		return d.route.addr
	}
	return d.opts.Gateway
}
