"""Unit 7 (notebook 07): what one device holds while training, measured and modelled; ZeRO and FSDP."""
