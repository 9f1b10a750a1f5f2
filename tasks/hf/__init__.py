"""Hugging Face interop: model directories (config.json + safetensors) in and out of Frenzy."""
