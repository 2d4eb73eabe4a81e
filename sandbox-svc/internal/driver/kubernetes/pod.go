package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// ErrPodFailed: the sandbox's pod did not become ready (its image cannot
// be pulled, it crashed, it was never scheduled); the error carries the
// reason from the pod's status and events.
var ErrPodFailed = fmt.Errorf("%w: pod", driver.ErrStartFailed)

var notLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// podName is a DNS label from the sandbox id.
func podName(id string) string {
	n := strings.Trim(notLabel.ReplaceAllString(strings.ToLower(id), "-"), "-")
	if n == "" || len(n) > 50 || n != id {
		sum := sha256.Sum256([]byte(id))
		if len(n) > 40 {
			n = strings.Trim(n[:40], "-")
		}
		n += "-" + hex.EncodeToString(sum[:4])
	}
	return "hangar-" + n
}

// labelValue makes s a valid label value (63 characters of [A-Za-z0-9._-],
// alphanumeric at both ends); a changed value gets a hash suffix.
func labelValue(s string) string {
	v := regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(s, "-")
	v = strings.Trim(v, "-._")
	if v == s && len(v) <= 63 {
		return v
	}
	sum := sha256.Sum256([]byte(s))
	if len(v) > 50 {
		v = strings.Trim(v[:50], "-._")
	}
	return strings.Trim(v+"-"+hex.EncodeToString(sum[:5]), "-._")
}

func workKeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// Create starts a pod for spec, waits for it to be ready, clones the
// repository into it and runs the setup. On error the pod (and its
// NetworkPolicy) is deleted.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (driver.Sandbox, error) {
	if spec.ID == "" {
		return nil, errors.New("sandbox id is required")
	}
	key := spec.WorkKey
	if key == "" {
		key = spec.ID
	}
	if !driver.ValidKey(key) {
		return nil, fmt.Errorf("work key %q: letters, digits, '.', '_' and '-' only", key)
	}
	name := podName(spec.ID)
	sb := newSandbox(d, spec, name, key)
	if err := d.reserve(ctx, sb); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			d.release(sb)
			delCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = d.deletePod(delCtx, name, 0)
		}
	}()
	if err := d.startPod(ctx, sb); err != nil {
		return nil, err
	}
	if err := sb.prepare(ctx); err != nil {
		return nil, err
	}
	if err := sb.record(ctx); err != nil {
		return nil, err
	}
	ok = true
	return sb, nil
}

// startPod makes the sandbox's NetworkPolicy (egress none) and pod and
// waits for the pod to be ready.
func (d *Driver) startPod(ctx context.Context, sb *Sandbox) error {
	if sb.spec.Egress == driver.EgressNone {
		if err := d.createPolicy(ctx, sb); err != nil {
			return err
		}
	} else if _, err := d.gateway(ctx); err != nil {
		// Egress full reaches the gateway by its name too.
		d.log.LogAttrs(ctx, slog.LevelDebug, "gateway not resolved", slog.String("gateway", d.opts.Gateway), slog.String("error", err.Error()))
	}
	pod, err := d.client.CoreV1().Pods(d.opts.Namespace).Create(ctx, d.podFor(sb), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", d.opts.Namespace, sb.pod, d.mapErr(err))
	}
	sb.setPod(pod)
	if pod, err = d.waitReady(ctx, pod); err != nil {
		return err
	}
	sb.setPod(pod)
	sb.mu.Lock()
	sb.createdAt = pod.CreationTimestamp.Time
	sb.mu.Unlock()
	return nil
}

// reserve records sb as live and its work key as taken: ErrInUse when a
// live sandbox here or a pod of any replica holds the key.
func (d *Driver) reserve(ctx context.Context, sb *Sandbox) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return errors.New("kubernetes driver closed")
	}
	if _, taken := d.keys[sb.key]; taken {
		d.mu.Unlock()
		return fmt.Errorf("%w: %s", driver.ErrInUse, sb.key)
	}
	d.keys[sb.key] = sb.pod
	d.live[sb.pod] = sb
	d.mu.Unlock()
	list, err := d.client.CoreV1().Pods(d.opts.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: LabelManagedBy + "=" + managedBy + "," + LabelWorkKey + "=" + workKeyHash(sb.key)})
	if err == nil {
		for _, p := range list.Items {
			if p.Name != sb.pod && p.DeletionTimestamp == nil && p.Annotations[AnnotationWorkKey] == sb.key {
				err = fmt.Errorf("%w: %s (pod %s)", driver.ErrInUse, sb.key, p.Name)
				break
			}
		}
	} else {
		err = fmt.Errorf("list pods in %s: %w", d.opts.Namespace, d.mapErr(err))
	}
	if err != nil {
		d.release(sb)
	}
	return err
}

// release forgets sb (its pod is gone or going).
func (d *Driver) release(sb *Sandbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb.mu.Lock()
	key := sb.key
	sb.mu.Unlock()
	if d.keys[key] == sb.pod {
		delete(d.keys, key)
	}
	if d.live[sb.pod] == sb {
		delete(d.live, sb.pod)
	}
}

func (d *Driver) labels(sb *Sandbox) map[string]string {
	state := StateClaimed
	if sb.spec.Pool != "" && sb.spec.WorkKey == "" {
		state = StateWarm
	}
	l := map[string]string{
		LabelManagedBy:   managedBy,
		LabelSandbox:     labelValue(sb.spec.ID),
		LabelEnvironment: labelValue(sb.spec.Environment),
		LabelOwner:       d.opts.Replica,
		LabelState:       state,
		LabelWorkKey:     workKeyHash(sb.key),
	}
	if state == StateWarm {
		l[LabelPool] = labelValue(sb.spec.Pool)
	}
	return l
}

// podFor is the sandbox's pod.
func (d *Driver) podFor(sb *Sandbox) *corev1.Pod {
	image := sb.spec.Image
	if image == "" {
		image = d.opts.Image
	}
	grace := int64(d.opts.DeleteGrace / time.Second)
	sandboxes := corev1.EmptyDirVolumeSource{}
	if sb.spec.DiskGB > 0 {
		q := resource.MustParse(fmt.Sprintf("%dGi", sb.spec.DiskGB))
		sandboxes.SizeLimit = &q
	}
	res := corev1.ResourceRequirements{}
	if sb.spec.CPUMillis > 0 || sb.spec.MemoryMB > 0 {
		res.Requests, res.Limits = corev1.ResourceList{}, corev1.ResourceList{}
	}
	if sb.spec.CPUMillis > 0 {
		q := resource.NewMilliQuantity(int64(sb.spec.CPUMillis), resource.DecimalSI)
		res.Requests[corev1.ResourceCPU], res.Limits[corev1.ResourceCPU] = *q, *q
	}
	if sb.spec.MemoryMB > 0 {
		q := resource.NewQuantity(int64(sb.spec.MemoryMB)<<20, resource.BinarySI)
		res.Requests[corev1.ResourceMemory], res.Limits[corev1.ResourceMemory] = *q, *q
	}
	if sb.spec.DiskGB > 0 {
		q := resource.MustParse(fmt.Sprintf("%dGi", sb.spec.DiskGB))
		if res.Requests == nil {
			res.Requests, res.Limits = corev1.ResourceList{}, corev1.ResourceList{}
		}
		res.Requests[corev1.ResourceEphemeralStorage] = q
	}
	mounts := []corev1.VolumeMount{
		{Name: "sandboxes", MountPath: SandboxesDir},
		{Name: "tool", MountPath: ToolDir},
	}
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   sb.pod,
			Labels: d.labels(sb),
			Annotations: map[string]string{
				AnnotationID: sb.spec.ID, AnnotationEnv: sb.spec.Environment, AnnotationWorkKey: sb.key,
				AnnotationEgress: egressName(sb.spec.Egress), AnnotationImage: image,
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeName:                      d.opts.NodeName,
			NodeSelector:                  d.opts.NodeSelector,
			Tolerations:                   d.opts.Tolerations,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			Volumes: []corev1.Volume{
				{Name: "sandboxes", VolumeSource: corev1.VolumeSource{EmptyDir: &sandboxes}},
				{Name: "tool", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			InitContainers: []corev1.Container{{
				Name:         "hangar-tool",
				Image:        d.opts.ToolImage,
				Command:      mustArgv(d.opts.ToolPath, sandboxtool.CommandInstall, sandboxtool.InstallRequest{Dir: ToolDir}),
				VolumeMounts: []corev1.VolumeMount{{Name: "tool", MountPath: ToolDir}},
			}},
			Containers: []corev1.Container{{
				Name:  container,
				Image: image,
				// pid 1 waits for the end of the grace period on TERM, so a
				// pod deleted by someone else stays whole for its hooks.
				Command:      toolArgv(sandboxtool.CommandHold, sandboxtool.HoldRequest{RunDir: RunDir}),
				Resources:    res,
				VolumeMounts: mounts,
			}},
		},
	}
}

// waitReady watches the pod until it is ready, fails, or the ready
// timeout passes.
func (d *Driver) waitReady(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	pods := d.client.CoreV1().Pods(d.opts.Namespace)
	rv := pod.ResourceVersion
	for {
		if done, err := podStarted(pod); done || err != nil {
			if err != nil {
				return nil, d.startFailure(pod, err.Error())
			}
			return pod, nil
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String(), ResourceVersion: rv})
		if err != nil {
			if ctx.Err() != nil {
				return nil, d.startFailure(pod, "not ready within "+d.opts.ReadyTimeout.String())
			}
			return nil, fmt.Errorf("watch pod %s: %w", pod.Name, d.mapErr(err))
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Deleted:
				w.Stop()
				return nil, fmt.Errorf("%w: pod %s/%s was deleted while starting", ErrPodFailed, d.opts.Namespace, pod.Name)
			case watch.Error:
				continue
			}
			if p, ok := ev.Object.(*corev1.Pod); ok {
				pod, rv = p, p.ResourceVersion
				if done, err := podStarted(pod); done || err != nil {
					w.Stop()
					if err != nil {
						return nil, d.startFailure(pod, err.Error())
					}
					return pod, nil
				}
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return nil, d.startFailure(pod, "not ready within "+d.opts.ReadyTimeout.String())
		}
		if p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			pod, rv = p, p.ResourceVersion
		}
	}
}

// waitingFatal are container waiting reasons that do not get better by
// waiting (the kubelet's image and config errors).
var waitingFatal = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true, "CrashLoopBackOff": true,
}

// podStarted says whether the pod is ready, or why it never will be.
func podStarted(pod *corev1.Pod) (bool, error) {
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		msg := pod.Status.Message
		if msg == "" {
			msg = pod.Status.Reason
		}
		return false, fmt.Errorf("pod %s: %s", strings.ToLower(string(pod.Status.Phase)), msg)
	}
	for _, cs := range append(slices(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && waitingFatal[w.Reason] {
			return false, fmt.Errorf("container %s: %s: %s", cs.Name, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return false, fmt.Errorf("container %s exited %d: %s %s", cs.Name, t.ExitCode, t.Reason, t.Message)
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true, nil
		}
	}
	return false, nil
}

func slices(s []corev1.ContainerStatus) []corev1.ContainerStatus {
	return append([]corev1.ContainerStatus(nil), s...)
}

// startFailure is ErrPodFailed with what the pod's status and its
// Warning events say.
func (d *Driver) startFailure(pod *corev1.Pod, status string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reason := status
	// The kubelet records its events apart from the status: give them a
	// moment to arrive.
	var evs *corev1.EventList
	var err error
	for try := 0; try < 5; try++ {
		evs, err = d.client.CoreV1().Events(d.opts.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", pod.Name),
				fields.OneTermEqualSelector("involvedObject.kind", "Pod")).String()})
		if err != nil || hasWarning(evs.Items) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err == nil {
		items := evs.Items
		sort.SliceStable(items, func(i, j int) bool { return eventTime(items[i]).Before(eventTime(items[j])) })
		var warnings []string
		seen := map[string]bool{}
		for _, e := range items {
			if e.Type != corev1.EventTypeWarning || (pod.UID != "" && e.InvolvedObject.UID != "" && e.InvolvedObject.UID != pod.UID) {
				continue
			}
			m := e.Reason + ": " + e.Message
			if !seen[m] {
				seen[m] = true
				warnings = append(warnings, m)
			}
		}
		if len(warnings) > 0 {
			reason += "; events: " + strings.Join(warnings, "; ")
		}
		if last := lastEvent(items, pod); last != "" && !seen[last] {
			// A pod that never became ready often has no warning of its
			// own (an image pull that hangs): what it was doing last is
			// the reason.
			reason += "; last event: " + last
		}
	}
	if pod.Status.Phase == corev1.PodPending && pod.Spec.NodeName == "" {
		reason += " (not scheduled to a node)"
	}
	return fmt.Errorf("%w: pod %s/%s (image %s): %s", ErrPodFailed, d.opts.Namespace, pod.Name, podImage(pod), reason)
}

// lastEvent is the newest of the pod's events (sorted oldest first) but
// the advisory ones, as "reason: message", or "".
func lastEvent(items []corev1.Event, pod *corev1.Pod) string {
	for i := len(items) - 1; i >= 0; i-- {
		e := items[i]
		if advisoryWarnings[e.Reason] {
			// Recorded again at each sync of the pod, it is often the
			// newest, and says nothing of what the pod was doing.
			continue
		}
		if pod.UID == "" || e.InvolvedObject.UID == "" || e.InvolvedObject.UID == pod.UID {
			return e.Reason + ": " + e.Message
		}
	}
	return ""
}

func hasWarning(evs []corev1.Event) bool {
	for _, e := range evs {
		if e.Type == corev1.EventTypeWarning && !advisoryWarnings[e.Reason] {
			return true
		}
	}
	return false
}

// advisoryWarnings are Warning events a kubelet records for a pod that
// starts anyway (a node without cluster DNS falls back to the host's):
// they are reported with a failure but are not why it failed, so the
// wait for the failure's own event goes on past them.
var advisoryWarnings = map[string]bool{"MissingClusterDNS": true, "DNSConfigForming": true}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func podImage(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	return ""
}

// deletePod deletes the pod and its NetworkPolicy; grace < 0 keeps the
// pod's own. A pod already gone is not an error.
func (d *Driver) deletePod(ctx context.Context, name string, grace int64) error {
	opts := metav1.DeleteOptions{}
	if grace >= 0 {
		opts.GracePeriodSeconds = &grace
	}
	err := d.client.CoreV1().Pods(d.opts.Namespace).Delete(ctx, name, opts)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", d.opts.Namespace, name, d.mapErr(err))
	}
	err = d.client.NetworkingV1().NetworkPolicies(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete network policy %s/%s: %w", d.opts.Namespace, name, d.mapErr(err))
	}
	return nil
}

// createPolicy makes the NetworkPolicy of a sandbox with egress none: its
// pod may send only to the gateway (no DNS, nothing else). It exists
// before the pod, so the pod never runs without it.
func (d *Driver) createPolicy(ctx context.Context, sb *Sandbox) error {
	route, err := d.gateway(ctx)
	if err != nil {
		return err
	}
	var egress []networkingv1.NetworkPolicyEgressRule
	if d.opts.Gateway != "" {
		egress = []networkingv1.NetworkPolicyEgressRule{route.rule}
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: sb.pod, Labels: map[string]string{
			LabelManagedBy: managedBy, LabelSandbox: labelValue(sb.spec.ID), LabelOwner: d.opts.Replica}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: managedBy, LabelSandbox: labelValue(sb.spec.ID)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress},
			Egress:      egress,
		},
	}
	if _, err := d.client.NetworkingV1().NetworkPolicies(d.opts.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create network policy %s/%s: %w", d.opts.Namespace, sb.pod, d.mapErr(err))
	}
	return nil
}

// Leftovers lists the pods of replicas whose Lease has run out (or is
// gone): an earlier process of this service that crashed, or a replica
// that stopped without destroying them.
func (d *Driver) Leftovers(ctx context.Context) ([]driver.Leftover, error) {
	pods, err := d.client.CoreV1().Pods(d.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + managedBy})
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", d.opts.Namespace, d.mapErr(err))
	}
	alive := map[string]bool{d.opts.Replica: true}
	checked := map[string]bool{d.opts.Replica: true}
	var out []driver.Leftover
	for _, p := range pods.Items {
		owner := p.Labels[LabelOwner]
		if !checked[owner] {
			checked[owner] = true
			alive[owner], err = d.replicaAlive(ctx, owner)
			if err != nil {
				return nil, err
			}
		}
		if alive[owner] {
			continue
		}
		out = append(out, driver.Leftover{
			Key: p.Annotations[AnnotationWorkKey], ID: p.Annotations[AnnotationID], Environment: p.Annotations[AnnotationEnv],
			Where: "pod " + path.Join(d.opts.Namespace, p.Name) + " of replica " + owner + "@rv" + p.ResourceVersion,
		})
	}
	return out, nil
}

// replicaAlive says whether the replica's Lease is current.
func (d *Driver) replicaAlive(ctx context.Context, replica string) (bool, error) {
	if replica == "" {
		return false, nil
	}
	l, err := d.client.CoordinationV1().Leases(d.opts.Namespace).Get(ctx, "hangar-sandbox-svc-"+replica, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("replica lease %s: %w", replica, d.mapErr(err))
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false, nil
	}
	return d.opts.Now().Before(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)), nil
}

// RemoveLeftover deletes the leftover's pod unless it changed since it was
// listed (a replica claimed it): the delete carries its resourceVersion.
func (d *Driver) RemoveLeftover(ctx context.Context, lo driver.Leftover) (bool, error) {
	where, rv, ok := strings.Cut(lo.Where, "@rv")
	if !ok {
		return false, fmt.Errorf("leftover %q was not listed by this driver", lo.Where)
	}
	name := strings.Fields(strings.TrimPrefix(where, "pod "))[0]
	name = path.Base(name)
	grace := int64(0)
	err := d.client.CoreV1().Pods(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	switch {
	case apierrors.IsConflict(err):
		return false, nil
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, fmt.Errorf("delete leftover pod %s: %w", name, d.mapErr(err))
	}
	err = d.client.NetworkingV1().NetworkPolicies(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("delete leftover network policy %s: %w", name, d.mapErr(err))
	}
	return true, nil
}

func egressName(e driver.Egress) string {
	if e == driver.EgressNone {
		return "none"
	}
	return "full"
}
