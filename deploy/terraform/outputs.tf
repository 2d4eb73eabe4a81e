output "session_bucket" {
  description = "The checkpoint bucket as HANGAR_SESSION_STORE takes it (gs://bucket; add /prefix to share it)."
  value       = "gs://${google_storage_bucket.sessions.name}"
}

output "checkpoint_service_account" {
  description = "Google service account of checkpoint-svc (the iam.gke.io/gcp-service-account annotation in deploy/overlays/gke)."
  value       = google_service_account.checkpoint.email
}

output "image_repository" {
  description = "Where to push the images: <repository>/<name>:<tag>."
  value       = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
}

output "cluster_name" {
  value = google_container_cluster.hangar.name
}

output "get_credentials" {
  description = "The command that points kubectl at the cluster."
  value       = "gcloud container clusters get-credentials ${google_container_cluster.hangar.name} --location ${var.location} --project ${var.project_id}"
}
