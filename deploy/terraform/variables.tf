variable "project_id" {
  description = "Google Cloud project to run hangar in."
  type        = string
}

variable "region" {
  description = "Region of the bucket and the image repository."
  type        = string
  default     = "us-central1"
}

variable "location" {
  description = "Zone (or region, for a regional control plane) of the GKE cluster."
  type        = string
  default     = "us-central1-a"
}

variable "cluster_name" {
  description = "Name of the GKE cluster."
  type        = string
  default     = "hangar"
}

variable "namespace" {
  description = "Kubernetes namespace hangar runs in (the deploy/ overlays use hangar)."
  type        = string
  default     = "hangar"
}

variable "control_machine_type" {
  description = "Machine type of the control pool (hangar's services, Redis)."
  type        = string
  default     = "e2-standard-4"
}

variable "control_nodes" {
  description = "Nodes in the control pool: two or more, so each service's two replicas run on different nodes."
  type        = number
  default     = 2
  validation {
    condition     = var.control_nodes >= 1
    error_message = "control_nodes must be at least 1."
  }
}

variable "sandbox_machine_type" {
  description = "Machine type of the sandbox pool. An n2-standard-8 is roughly $280/month on demand while it runs."
  type        = string
  default     = "n2-standard-8"
}

variable "sandbox_min_nodes" {
  description = "Fewest sandbox nodes (0: the pool scales to nothing when every session is suspended)."
  type        = number
  default     = 0
}

variable "sandbox_max_nodes" {
  description = "Most sandbox nodes the autoscaler makes."
  type        = number
  default     = 4
}

variable "image_streaming" {
  description = "GKE image streaming on the sandbox pool: pods start before their image is fully pulled (faster cold starts). Changing it recreates the sandbox nodes: suspend sessions first; they resume from their checkpoints."
  type        = bool
  default     = false
}

variable "sandbox_disk_gb" {
  description = "Boot disk (SSD) of each sandbox node, in GB. 100 lets more nodes fit the default 500 GB SSD quota. Changing it recreates the sandbox nodes: suspend sessions first."
  type        = number
  default     = 250
  validation {
    condition     = var.sandbox_disk_gb >= 20 && floor(var.sandbox_disk_gb) == var.sandbox_disk_gb
    error_message = "sandbox_disk_gb must be a whole number of GB, 20 or more."
  }
}

variable "session_retention_days" {
  description = "Delete checkpoint objects older than this many days. null (the default): the bucket has no age-based deletion."
  type        = number
  default     = null
  validation {
    condition     = var.session_retention_days == null ? true : var.session_retention_days >= 1
    error_message = "session_retention_days must be null (keep everything) or 1 or more."
  }
}

variable "bucket_name" {
  description = "Name of the checkpoint bucket; empty: <project_id>-hangar-sessions."
  type        = string
  default     = ""
}

variable "deletion_protection" {
  description = "Refuse to destroy the cluster and the bucket's contents with terraform destroy."
  type        = bool
  default     = true
}
