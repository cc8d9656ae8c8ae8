// The training view: a run followed as it goes (/v1/runs).
import { $ } from "./api.js";
