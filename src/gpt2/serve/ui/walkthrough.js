// The walkthrough view: the seeds' forward pass on one prompt (/v1/walk).
import { $ } from "./api.js";
