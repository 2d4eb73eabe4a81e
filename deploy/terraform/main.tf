# A GKE cluster for hangar: a control pool for the services (deploy/overlays/gke
# selects it with hangar.dev/pool=control), an autoscaled sandbox pool for
# sandbox pods, Dataplane V2 (it enforces the NetworkPolicies that keep
# sandboxes to the gateway), workload identity, the checkpoint bucket and
# the image repository.

locals {
  bucket_name = var.bucket_name != "" ? var.bucket_name : "${var.project_id}-hangar-sessions"
}

resource "google_service_account" "nodes" {
  account_id   = "hangar-nodes"
  display_name = "hangar GKE nodes"
}

resource "google_project_iam_member" "nodes" {
  for_each = toset([
    "roles/artifactregistry.reader",
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
  ])
  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_container_cluster" "hangar" {
  name     = var.cluster_name
  location = var.location

  remove_default_node_pool = true
  initial_node_count       = 1
  deletion_protection      = var.deletion_protection

  datapath_provider = "ADVANCED_DATAPATH"
  networking_mode   = "VPC_NATIVE"
  ip_allocation_policy {}

  workload_identity_config {
    workload_pool = "${var.project_id}.svc.id.goog"
  }

  release_channel {
    channel = "REGULAR"
  }
}

resource "google_container_node_pool" "control" {
  name       = "control"
  cluster    = google_container_cluster.hangar.id
  location   = var.location
  node_count = var.control_nodes

  node_config {
    machine_type    = var.control_machine_type
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    labels          = { "hangar.dev/pool" = "control" }
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }
}

# Sandbox nodes. image_streaming and sandbox_disk_gb are the Cost and speed
# settings: both recreate these nodes when changed.
resource "google_container_node_pool" "sandbox" {
  name     = "sandbox"
  cluster  = google_container_cluster.hangar.id
  location = var.location

  autoscaling {
    min_node_count = var.sandbox_min_nodes
    max_node_count = var.sandbox_max_nodes
  }

  node_config {
    machine_type    = var.sandbox_machine_type
    disk_type       = "pd-ssd"
    disk_size_gb    = var.sandbox_disk_gb
    image_type      = "COS_CONTAINERD"
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    labels          = { "hangar.dev/pool" = "sandbox" }
    # Only sandbox pods (HANGAR_KUBE_TOLERATIONS in deploy/overlays/gke)
    # run here: an agent's pod never shares a node with the control plane.
    taint {
      key    = "hangar.dev/pool"
      value  = "sandbox"
      effect = "NO_SCHEDULE"
    }
    gcfs_config {
      enabled = var.image_streaming
    }
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }
}

# Durable checkpoints (HANGAR_SESSION_STORE=gs://...). No age-based
# deletion unless session_retention_days is set.
resource "google_storage_bucket" "sessions" {
  name                        = local.bucket_name
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection

  dynamic "lifecycle_rule" {
    for_each = var.session_retention_days == null ? [] : [var.session_retention_days]
    content {
      condition {
        age = lifecycle_rule.value
      }
      action {
        type = "Delete"
      }
    }
  }
}

# checkpoint-svc's identity: its Kubernetes ServiceAccount (deploy/base,
# annotated in deploy/overlays/gke) acts as this Google service account.
resource "google_service_account" "checkpoint" {
  account_id   = "hangar-checkpoint"
  display_name = "hangar checkpoint-svc"
}

resource "google_storage_bucket_iam_member" "checkpoint" {
  bucket = google_storage_bucket.sessions.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.checkpoint.email}"
}

resource "google_service_account_iam_member" "checkpoint_workload_identity" {
  service_account_id = google_service_account.checkpoint.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/hangar-checkpoint-svc]"
}

# gateway-svc keeps the model tapes and its run journal in the same bucket
# (keys tapes/ and runs/), so every gateway replica reads every tape: its
# Kubernetes ServiceAccount acts as the same Google service account.
resource "google_service_account_iam_member" "gateway_workload_identity" {
  service_account_id = google_service_account.checkpoint.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/hangar-gateway-svc]"
}

# Images (deploy/images/build writes them; crane push them here). Image
# streaming needs them in Artifact Registry.
resource "google_artifact_registry_repository" "images" {
  location      = var.region
  repository_id = "hangar"
  format        = "DOCKER"
}
