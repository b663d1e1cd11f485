package controlplane

// MaintenanceProto is maintenanceProto, for the fuzz test's round trip.
var MaintenanceProto = maintenanceProto
